"""The product package never depends on the development tools.

``seqcls`` (plugins/, imported by the release steps and scanned by Airflow's plugin loader) must
work without ``seqcls_tools`` (tools/: demo, benchmark, tiny checkpoints). Only ``seqcls.cli``
may reach it, lazily, to register the development subcommands.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
TOOLS = "seqcls_tools"
#: The one place allowed to name the tools: the CLI wiring of their subcommands.
ALLOWED = {PLUGINS / "seqcls" / "cli.py"}

_IMPORT_ALL = textwrap.dedent(
    """
    import importlib, json, os, pkgutil, sys, traceback
    import seqcls

    def modules(path, prefix):
        # iter_modules per directory: packages are walked without importing seqcls.airflow at all
        for info in pkgutil.iter_modules(path, prefix):
            if info.name.startswith("seqcls.airflow") or info.name.rsplit(".", 1)[-1] == "__main__":
                continue
            yield info.name
            if info.ispkg:
                sub = [os.path.join(p, info.name.rsplit(".", 1)[-1]) for p in path]
                yield from modules(sub, info.name + ".")

    names = ["seqcls", "seqcls.cli", *modules(seqcls.__path__, "seqcls.")]
    failed = {}
    for name in dict.fromkeys(names):
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed[name] = "".join(traceback.format_exception_only(exc)).strip()
    print(json.dumps({
        "imported": sorted(set(names) - set(failed)),
        "failed": failed,
        "tools": sorted(m for m in sys.modules if m == "seqcls_tools" or m.startswith("seqcls_tools.")),
    }))
    """
)


def test_importing_every_product_module_leaves_the_tools_unimported(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL],
        cwd=tmp_path,  # the installed packages, not whatever the test's cwd holds
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "seqcls.localtriton" in result["imported"]
    assert not result["tools"], f"importing seqcls pulled in the development tools: {result['tools']}"
    failed = [f"{name}: {error}" for name, error in result["failed"].items()]
    assert not failed, "product modules that do not import (so they were not checked):\n" + "\n".join(failed)


def _tool_imports(path: Path) -> list[str]:
    """``line: statement`` for every import of seqcls_tools in ``path`` (static or importlib)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        if any(n == TOOLS or n.startswith(TOOLS + ".") for n in names):
            found.append(f"{path.relative_to(PLUGINS.parent)}:{node.lineno}")
    return found


def test_no_product_file_imports_the_tools() -> None:
    files = [p for p in sorted(PLUGINS.rglob("*.py")) if p not in ALLOWED and "__pycache__" not in p.parts]
    assert PLUGINS / "seqcls" / "localtriton" / "server.py" in files
    offenders = [hit for path in files for hit in _tool_imports(path)]
    assert not offenders, f"the product imports seqcls_tools (only seqcls/cli.py may): {offenders}"
