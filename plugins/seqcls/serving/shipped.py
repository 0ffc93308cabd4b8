"""Import the self-contained serving modules that ``model_repository/`` ships into Triton.

Triton's python models cannot import ``seqcls``; they run ``seqcls_text.py`` (tokenizer) and
``seqcls_decide.py`` (postprocess) copied next to their ``model.py``, and all of them read names
and enums from ``seqcls_contract.py``. The parity gate, the renderer and the smoke test import
those very files from the serving source through this module, so what is validated is exactly
what is served. The contract is registered under its plain module name, as it is inside Triton,
so ``import seqcls_contract`` in the other shipped files resolves to the same file here.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

from seqcls.errors import InputError
from seqcls.serving.names import MODEL, POSTPROCESS, TOKENIZER
from seqcls.settings import Settings

COMMON_DIR = "common"
CONTRACT = "seqcls_contract"
#: The serving logic, importable outside Triton too (the library, the MLflow pyfunc).
MODULES = (CONTRACT, "seqcls_text", "seqcls_decide")
#: Triton python-backend glue (per-request errors, logging): imports triton_python_backend_utils.
BACKEND = "seqcls_backend"
#: Which shipped modules each python model version carries (besides its model.py).
SHIPPED_WITH = {
    TOKENIZER: (CONTRACT, BACKEND, "seqcls_text"),
    MODEL: (CONTRACT, BACKEND),
    POSTPROCESS: (CONTRACT, BACKEND, "seqcls_decide"),
}


def common_dir(settings: Settings | None = None) -> Path:
    src = (settings or Settings.from_env()).model_repository_source
    assert src is not None
    path = Path(src) / COMMON_DIR
    if not path.is_dir():
        raise InputError(
            f"{path}: serving source not found; set SEQCLS_MODEL_REPOSITORY_SOURCE to the project's "
            "model_repository/ directory."
        )
    return path


@cache
def _load(path: Path) -> ModuleType:
    if path.stem != CONTRACT:
        _load(path.with_name(f"{CONTRACT}.py"))
    name = CONTRACT if path.stem == CONTRACT else f"_seqcls_shipped_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load(name: str, settings: Settings | None = None) -> ModuleType:
    """The shipped module ``name`` (one of :data:`MODULES`) from the serving source."""
    if name not in MODULES:
        raise ValueError(f"unknown shipped module {name!r}; expected one of {MODULES}")
    return _load((common_dir(settings) / f"{name}.py").resolve())


def text(settings: Settings | None = None) -> ModuleType:
    return load("seqcls_text", settings)


def decide(settings: Settings | None = None) -> ModuleType:
    return load("seqcls_decide", settings)


def contract(settings: Settings | None = None) -> ModuleType:
    return load(CONTRACT, settings)


def files_for(model: str, settings: Settings | None = None) -> dict[str, Path]:
    """The shipped modules a python model version carries: target file name -> source path."""
    common = common_dir(settings)
    return {f"{name}.py": common / f"{name}.py" for name in SHIPPED_WITH.get(model, ())}
