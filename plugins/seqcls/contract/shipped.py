"""The self-contained serving modules that ``model_repository/`` ships into Triton, as seqcls imports them.

Triton's python models cannot import ``seqcls``; they run ``seqcls_text.py`` (tokenizer) and
``seqcls_decide.py`` (postprocess) and ``seqcls_engine.py`` (``seqcls_model``: OpenVINO for bf16)
copied next to their ``model.py``, and all of them read names
and enums from ``seqcls_contract.py`` (``seqcls_backend.py``: the python-backend glue). The five
live in ``model_repository/common/`` and are installed with the package as top-level modules
under the same names (pyproject's ``py-modules``), so they import each other inside Triton and
here alike. The parity gate, the renderer and the smoke test import them normally; publish copies
the very files imported (:func:`files_for`) and validate hashes them (:func:`common_dir`), so what
is validated is what is served.

The installed modules win. A serving source (``SEQCLS_MODEL_REPOSITORY_SOURCE``: templates and
``model.py`` files) may carry its own ``common/`` — a checkout does — but then it must hold the
same bytes: a differing copy is refused, naming both files, rather than validated one way and
served another. A source without ``common/`` serves the installed modules.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from types import ModuleType

import seqcls_contract
import seqcls_decide
import seqcls_engine
import seqcls_text

from seqcls.contract.names import MODEL, POSTPROCESS, TOKENIZER
from seqcls.errors import InputError
from seqcls.settings import Settings, model_repository_source_from_env

COMMON_DIR = "common"
CONTRACT = "seqcls_contract"
#: The serving logic, importable outside Triton too (the library, the MLflow pyfunc).
MODULES = (CONTRACT, "seqcls_text", "seqcls_decide", "seqcls_engine")
#: Triton python-backend glue (per-request errors, logging): imports triton_python_backend_utils,
#: so it is installed beside the others but never imported outside Triton.
BACKEND = "seqcls_backend"
#: Which shipped modules each python model version carries (besides its model.py).
SHIPPED_WITH = {
    TOKENIZER: (CONTRACT, BACKEND, "seqcls_text"),
    MODEL: (CONTRACT, BACKEND, "seqcls_engine"),
    POSTPROCESS: (CONTRACT, BACKEND, "seqcls_decide"),
}
_IMPORTED = {
    CONTRACT: seqcls_contract,
    "seqcls_text": seqcls_text,
    "seqcls_decide": seqcls_decide,
    "seqcls_engine": seqcls_engine,
}
#: Where the imported serving modules live (site-packages, or ``model_repository/common`` in a checkout).
INSTALLED_DIR = Path(seqcls_contract.__file__).resolve().parent


def _signature(common: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a file of ``common`` does (the byte comparison is repeated only then)."""
    stats = []
    for name in (*MODULES, BACKEND):
        try:
            st = (common / f"{name}.py").stat()
        except FileNotFoundError:
            stats.append((name, -1, -1))
        else:
            stats.append((name, st.st_mtime_ns, st.st_size))
    return tuple(stats)


@cache
def _compare(common: Path, signature: tuple[tuple[str, int, int], ...]) -> str | None:
    """The first module whose copy in ``common`` differs from the imported one (None: all identical)."""
    for name in (*MODULES, BACKEND):
        theirs = common / f"{name}.py"
        if not theirs.is_file() or theirs.read_bytes() != (INSTALLED_DIR / f"{name}.py").read_bytes():
            return name
    return None


def _check_source(source: Path | None) -> None:
    """Refuse a serving source whose ``common/`` differs from the imported modules (see the module doc)."""
    if source is None:
        return
    common = (Path(source) / COMMON_DIR).resolve()
    if common == INSTALLED_DIR or not common.is_dir():
        return
    name = _compare(common, _signature(common))
    if name is not None:
        raise InputError(
            f"{common / f'{name}.py'} differs from {INSTALLED_DIR / f'{name}.py'}, the {name} seqcls imports (and "
            f"validates and ships): the serving source {source} and the installed package come from different "
            "trees. Reinstall the package from this source (make setup, or pip install .), or point "
            "SEQCLS_MODEL_REPOSITORY_SOURCE at the model_repository/ it was built from."
        )


def common_dir(settings: Settings | None = None) -> Path:
    """The directory of the shipped modules: the files imported here, hashed by validate, copied by publish."""
    _check_source(settings.model_repository_source if settings else model_repository_source_from_env())
    return INSTALLED_DIR


def load(name: str, settings: Settings | None = None) -> ModuleType:
    """The shipped module ``name`` (one of :data:`MODULES`), once the serving source is checked to agree."""
    if name not in MODULES:
        raise ValueError(f"unknown shipped module {name!r}; expected one of {MODULES}")
    common_dir(settings)
    return _IMPORTED[name]


def text(settings: Settings | None = None) -> ModuleType:
    return load("seqcls_text", settings)


def decide(settings: Settings | None = None) -> ModuleType:
    return load("seqcls_decide", settings)


def contract(settings: Settings | None = None) -> ModuleType:
    return load(CONTRACT, settings)


def engine(settings: Settings | None = None) -> ModuleType:
    return load("seqcls_engine", settings)


def files_for(model: str, settings: Settings | None = None) -> dict[str, Path]:
    """The shipped modules a python model version carries: target file name -> the imported file."""
    common = common_dir(settings)
    return {f"{name}.py": common / f"{name}.py" for name in SHIPPED_WITH.get(model, ())}
