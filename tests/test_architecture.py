"""The architecture's rules, asserted: a house of floors, no copies, everything derived from one table.

- packages are floors: each imports only the floors below it, siblings on one floor not each other —
  the layers contract in ``pyproject.toml`` (``[tool.importlinter]``), checked by ``lint-imports`` with no
  exception listed, covering every package and root module; no package is a lone ``__init__.py``;
  a module is at most :data:`MAX_MODULE_LINES` lines (a guard against a 2,000-line module, not a
  reason to split by size) and a function at most :data:`MAX_FUNCTION_LINES`;
- a model name is checked (``ModelName(...)``) only where it enters (:data:`NAME_EDGES`), and what builds a
  path from it refuses an unchecked string;
- the import graph has no cycle, counting function-level imports; a function imports lazily only
  what is heavy or optional (never a cheap seqcls module to hide a cycle); no module imports
  another's ``_private`` name; step modules are leaves; the framework is branched on only inside
  ``seqcls.frameworks``; files are replaced only through ``seqcls.files``; test modules share code
  only through ``tests/helpers``;
- ``duplicates`` finds no pair of copied blocks longer than 10 lines under ``plugins/``, ``tools/``,
  ``model_repository/`` or ``tests/``;
- the DAG's task chain, its Params and the CLI's subcommands and flags equal what the step table
  (:mod:`seqcls.steps`) and the config table (:mod:`seqcls.config`) produce;
- environment variables are read only in ``settings.py`` (and the local Triton runner).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.airflow import private_airflow_home

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "plugins" / "seqcls"
TOOLS = ROOT / "tools" / "seqcls_tools"
DAGS = ROOT / "dags"
DAG_ID = "seqcls_release"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
#: Where reading the environment is allowed, relative to the package.
ENV_READERS = ("settings.py", "localtriton/")

AIRFLOW_HOME = private_airflow_home()  # before anything imports airflow


def _modules() -> list[Path]:
    mods = sorted(PACKAGE.rglob("*.py"))
    assert len(mods) > 20, f"found only {len(mods)} modules under {PACKAGE}"
    return mods


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _sized_modules() -> dict[str, Path]:
    """Every module the size limits cover: the product package and the development tools, by display name."""
    tools = sorted(TOOLS.rglob("*.py"))
    assert len(tools) > 10, f"found only {len(tools)} modules under {TOOLS}"
    sized = {_rel(path): path for path in _modules()}
    sized.update({path.relative_to(ROOT).as_posix(): path for path in tools})
    return sized


# ----------------------------------------------------------------------------- size limits


def test_no_module_over_the_line_limit() -> None:
    over = {}
    for name, path in _sized_modules().items():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            over[name] = lines
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split by concept into a package): {over}"


def test_no_function_over_the_line_limit() -> None:
    over = {}
    for name, path in _sized_modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min((d.lineno for d in node.decorator_list), default=node.lineno)
                lines = node.end_lineno - start + 1
                if lines > MAX_FUNCTION_LINES:
                    over[f"{name}:{node.lineno} {node.name}"] = lines
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (make them orchestration over named parts): {over}"


@pytest.mark.parametrize("tree", ["plugins", "tools", "model_repository", "tests"])
def test_no_duplicated_blocks(tree: str) -> None:
    exe = shutil.which("duplicates")
    if exe is None:
        pytest.skip("the `duplicates` command is not on PATH on this machine (CI images may lack it)")
    out = subprocess.run(
        [exe, "--repo", str(ROOT / tree), "--min-lines", "11"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "no duplicates" in out.stdout, f"copied blocks longer than 10 lines under {tree}/:\n{out.stdout[-4000:]}"


# ----------------------------------------------------------------------------- environment


def _environ_reads(path: Path) -> list[int]:
    """Lines that touch the process environment: ``os.environ``, ``os.getenv``, ``from os import environ``."""
    names = ("environ", "environb", "getenv", "getenvb")
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    hits = set()
    for node in ast.walk(tree):
        attribute = isinstance(node, ast.Attribute) and node.attr in names
        from_os = isinstance(node, ast.ImportFrom) and node.module == "os"
        if attribute and isinstance(node.value, ast.Name) and node.value.id == "os":
            hits.add(node.lineno)
        if from_os and any(a.name in names for a in node.names):
            hits.add(node.lineno)
    return sorted(hits)


def test_environment_is_read_only_in_settings() -> None:
    found = {}
    for path in _modules():
        rel = _rel(path)
        if rel in ENV_READERS or rel.startswith(tuple(p for p in ENV_READERS if p.endswith("/"))):
            continue
        lines = _environ_reads(path)
        if lines:
            found[rel] = lines
    assert not found, f"environment read outside settings.py (add a Settings field instead): {found}"


#: The environment's serving defaults (Settings fields); only the serving spec reads them (spec.py).
SERVING_SETTINGS = ("runtime", "device", "serving_layout", "serving_metrics", "serving_pipeline")
SPEC_HOME = "spec.py"


def _serving_setting_reads(path: Path) -> list[int]:
    """Lines reading a serving default off settings: ``settings.runtime``, ``release.settings.device``..."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    hits = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in SERVING_SETTINGS:
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if "settings" in name:
                hits.add(node.lineno)
    return sorted(hits)


def test_serving_settings_are_read_only_by_the_serving_spec() -> None:
    """How a release is served comes from its recorded spec, never from a worker's settings at publish time."""
    found = {}
    for path in _modules():
        rel = _rel(path)
        if rel not in ("settings.py", SPEC_HOME) and (lines := _serving_setting_reads(path)):
            found[rel] = lines
    assert _serving_setting_reads(PACKAGE / SPEC_HOME), "spec.py resolves the defaults; the scan must see it"
    assert not found, f"serving settings read outside the serving spec (use release.serving): {found}"


def test_the_environment_check_sees_reads(tmp_path: Path) -> None:
    """The AST scan above has teeth: it flags every spelling of an environment read."""
    assert _environ_reads(PACKAGE / "settings.py"), "settings.py reads the environment, the scan must see it"
    sample = tmp_path / "probe.py"
    sample.write_text("import os\nfrom os import getenv\nx = os.environ.get('A')\ny = os.getenv('B')\n")
    assert _environ_reads(sample) == [2, 3, 4]


# ----------------------------------------------------------------------------- CLI from the tables


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_cli_subcommands_and_flags_come_from_the_tables() -> None:
    from seqcls import config
    from seqcls.cli import build_parser
    from seqcls.steps import EXTRA_STEPS, ORDER, STEPS

    steps = [s.name for s in (*STEPS, *EXTRA_STEPS)]
    commands = _subcommands(build_parser())
    assert [c for c in commands if c in steps] == steps, "step subcommands missing or out of table order"
    assert list(commands)[: len(steps)] == steps, "the step subcommands come first, in table order"
    flags_by_field = {f.name: f.flag for f in config.FIELDS}
    for name in (*steps, "release"):
        parser = commands[name]
        options = {opt: a for a in parser._actions for opt in a.option_strings}
        missing = [flag for flag in flags_by_field.values() if flag not in options]
        assert not missing, f"`seqcls {name}` lacks flags {missing}"
        for spec in config.FIELDS:
            action = options[spec.flag]
            assert action.dest == spec.name
            if spec.enum:
                assert list(action.choices) == list(spec.enum), f"{spec.flag} choices differ from config.FIELDS"
    until = {opt: a for a in commands["release"]._actions for opt in a.option_strings}["--until"]
    assert list(until.choices) == list(ORDER)


# ----------------------------------------------------------------------------- DAG from the tables


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    mp = pytest.MonkeyPatch()
    for var in ("SEQCLS_SCHEDULE", "SEQCLS_PADDLE_PYTHON", "SEQCLS_MODEL_NAME"):
        mp.delenv(var, raising=False)
    try:
        bag = DagBag(dag_folder=str(DAGS))
    finally:
        mp.undo()
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags[DAG_ID]


def _linear_chain(dag, ids: set[str]) -> list[str]:
    """The tasks ``ids`` as one chain (each has exactly one downstream among them but the last)."""
    heads = [t for t in ids if not (dag.get_task(t).upstream_task_ids & ids)]
    assert len(heads) == 1, f"not a single chain: several first tasks {heads}"
    chain = [heads[0]]
    while True:
        nxt = dag.get_task(chain[-1]).downstream_task_ids & ids
        if not nxt:
            break
        assert len(nxt) == 1, f"{chain[-1]} fans out to {sorted(nxt)}: not a linear chain"
        (task,) = nxt
        assert dag.get_task(task).upstream_task_ids & ids == {chain[-1]}, f"{task} has several upstreams"
        chain.append(task)
    return chain


def test_dag_chain_equals_the_step_table(dag) -> None:
    from seqcls.airflow.context import ROLLBACK_TASK, TASK_ORDER
    from seqcls.airflow.outcome import REPORT_TASK
    from seqcls.steps import STEPS

    assert set(dag.task_ids) == {*TASK_ORDER, REPORT_TASK}
    chain_ids = set(TASK_ORDER) - {ROLLBACK_TASK}
    assert _linear_chain(dag, chain_ids) == [t for t in TASK_ORDER if t != ROLLBACK_TASK]
    undo = {s.task_id for s in STEPS if s.undo_on_failure}
    assert undo, "the step table marks no step undo_on_failure"
    assert dag.get_task(ROLLBACK_TASK).upstream_task_ids == undo
    assert dag.get_task(ROLLBACK_TASK).downstream_task_ids == {REPORT_TASK}  # the teardown after every task
    assert dag.get_task(REPORT_TASK).upstream_task_ids == set(TASK_ORDER) and dag.get_task(REPORT_TASK).is_teardown


def test_dag_params_equal_the_config_table(dag) -> None:
    from seqcls import config
    from seqcls.airflow.params import schemas
    from seqcls.settings import DEFAULT_MODEL_NAME

    expected = schemas(DEFAULT_MODEL_NAME)
    assert list(dag.params) == list(expected)
    for spec in config.FIELDS:  # the release params are exactly config's schemas
        want = dict(config.param_schema(spec.name))
        if spec.name == "model_name":
            want["default"] = DEFAULT_MODEL_NAME
        assert expected[spec.name] == want
    for name, want in expected.items():
        param = dag.params.get_param(name)
        want = dict(want)
        assert param.value == want.pop("default"), f"param {name}: default differs"
        description = want.pop("description", None)
        assert param.description == description, f"param {name}: description differs"
        assert param.schema == want, f"param {name}: schema {param.schema} != {want}"


def test_no_literal_step_lists_in_the_tasks_test_script() -> None:
    """scripts/airflow-tasks-test.py derives its task list from seqcls.airflow (no copy of the order)."""
    from seqcls.airflow.context import TASK_ORDER
    from seqcls.steps import BY_NAME

    text = (ROOT / "scripts" / "airflow-tasks-test.py").read_text(encoding="utf-8")
    assert "TASK_ORDER" in text and "TASK_STEPS" in text
    quoted = set(re.findall(r"[\"']([a-z_]+)[\"']", text))
    copied = sorted(quoted & (set(TASK_ORDER) | set(BY_NAME)))
    assert not copied, f"task ids written out in the script: {copied}"


# ----------------------------------------------------------------------------- the manual from the tables


ARCHITECTURE_PAGE = ROOT / "docs" / "architecture.md"


def _architecture_page() -> str:
    return ARCHITECTURE_PAGE.read_text(encoding="utf-8")


def _table_rows(section: str, header: str) -> list[list[str]]:
    """The body rows of the Markdown table whose header line starts with ``header``."""
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_the_architecture_page_s_step_list_and_module_tables_follow_the_code() -> None:
    from seqcls.steps import EXTRA_STEPS, STEPS

    names = [s.name for s in (*STEPS, *EXTRA_STEPS)]
    section = _architecture_page()
    steps = _table_rows(section, "| step | what it does | module |")
    assert [row[0] for row in steps] == ["resolve", *names], "docs/architecture.md's step table is not the step table"
    cli_steps = re.search(r"Steps: `([^`]+)`", section).group(1)
    assert cli_steps.split() == names, "docs/architecture.md's `Steps:` list is not the step table"
    modules = [cell for row in steps for cell in row[-1].split(", ")]
    modules += [cell for row in _table_rows(section, "| module | owns |") for cell in row[0].split(", ")]
    missing = [m for m in modules if not (PACKAGE / m.strip("`")).exists()]
    assert not missing, f"docs/architecture.md names modules that do not exist under plugins/seqcls: {missing}"
    floors = {name for floor in _floors() for name in floor}
    listed = {cell.strip("`").rstrip("/").removesuffix(".py").split("/")[0] for cell in modules}
    assert floors <= listed, f"floors the architecture page does not describe: {sorted(floors - listed)}"


# ----------------------------------------------------------------------------- the house by concept

#: What a function may import lazily: heavy or optional third-party packages (cheap imports of the
#: library itself are module-level, so the import graph shows every dependency), Airflow's shell
#: (needs apache-airflow) and the development tools (not installed with the product).
LAZY_SEQCLS = ("seqcls.airflow", "seqcls_tools")
#: Where the framework (PaddleNLP vs transformers) may be branched on.
FRAMEWORK_HOME = "frameworks/"
#: Who may import a step module (``seqcls.steps.<step>``): the step table, the CLI and Airflow's shell.
STEP_IMPORTERS = ("steps/__init__.py", "cli.py", "airflow/")
#: The one durable writer (unique temp, fsync, rename, directory fsync).
DURABLE = "files.py"


def _module_name(path: Path) -> str:
    """``seqcls.x.y`` for a file under plugins/ (``seqcls_tools.…`` under tools/, the file's stem elsewhere)."""
    base = next((b for b in (PACKAGE.parent, TOOLS.parent) if path.is_relative_to(b)), path.parent)
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, int, bool, tuple[str, ...]]]:
    """``(module, line, inside a function, imported names)`` for every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function, ()) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                module = child.module or ""
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    module = ".".join([*base, module] if module else base)
                found.append((module, child.lineno, in_function, tuple(a.name for a in child.names)))
            visit(child, nested)

    visit(tree, False)
    return found


def _graph() -> dict[str, set[str]]:
    """Module → the seqcls modules it imports (function-level imports counted; ``from pkg import mod`` → mod)."""
    paths = {_module_name(p): p for p in _modules()}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets = set()
        for module, _, _, imported in _imports(path):
            if not module.startswith("seqcls.") and module != "seqcls":
                continue
            subs = [f"{module}.{n}" for n in imported if f"{module}.{n}" in paths]
            targets.update(subs or [module])
        graph[name] = {t for t in targets if t != name and t in paths}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _floors() -> list[list[str]]:
    """The layers contract's floors, top first, each a list of sibling names (``a | b``)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    assert contract["containers"] == ["seqcls"], contract
    return [[name.strip() for name in layer.replace(":", "|").split("|")] for layer in contract["layers"]]


def test_the_layers_contract_lists_every_package_and_no_exception() -> None:
    """A new package or root module cannot escape the floors, and nothing is waved through."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    for contract in config["contracts"]:
        assert not contract.get("ignore_imports"), f"{contract['name']}: exceptions listed {contract['ignore_imports']}"
        assert not contract.get("unmatched_ignore_imports_alerting"), contract
    listed = [name for floor in _floors() for name in floor]
    assert len(listed) == len(set(listed)), f"a name on two floors: {listed}"
    present = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    present |= {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert set(listed) == present, (
        f"not on a floor: {sorted(present - set(listed))}; gone: {sorted(set(listed) - present)}"
    )


def test_the_layers_contract_holds() -> None:
    exe = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(exe)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"lint-imports: a floor imports one above it\n{out.stdout[-4000:]}{out.stderr[-2000:]}"
    assert "Contracts: 1 kept, 0 broken." in out.stdout, out.stdout[-2000:]


def test_the_layers_check_sees_an_upward_import(tmp_path: Path) -> None:
    """lint-imports has teeth here: a lower floor's function-level import of a higher one breaks it."""
    pkg = tmp_path / "house"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "high.py").write_text("from house import low\n")
    (pkg / "low.py").write_text("def f():\n    from house import high  # upward, inside a function\n")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = house\n\n[importlinter:contract:floors]\nname = floors\ntype = layers\n"
        "layers =\n    house.high\n    house.low\n"
    )
    exe = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([str(exe)], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode != 0 and "house.low -> house.high" in out.stdout, out.stdout[-2000:]


def _package_of(module: str) -> str:
    """``seqcls.x.y`` → ``x`` (the floor name: a package or a root module)."""
    return module.split(".")[1] if module.count(".") else module


def test_no_import_runs_up_a_floor_and_no_two_packages_import_each_other() -> None:
    """The same rule read from this file's own import scan (function-level imports counted)."""
    floor_of = {name: i for i, floor in enumerate(_floors()) for name in floor}
    up, pairs = [], set()
    for source, targets in _graph().items():
        if source == "seqcls":
            continue
        a = _package_of(source)
        for target in targets:
            b = _package_of(target)
            if a == b or target == "seqcls":
                continue
            pairs.add((a, b))
            if floor_of[b] <= floor_of[a]:  # floors are listed top first: a lower floor has a higher index
                up.append(f"{source} -> {target}")
    assert not up, f"imports to the same or a higher floor: {up}"
    two_way = sorted({tuple(sorted(p)) for p in pairs if p[::-1] in pairs})
    assert not two_way, f"packages importing each other: {two_way}"


#: Where a model name enters and is checked into a ``ModelName``: the CLI, the release parameters, Airflow's
#: shell (params, the models file, XCom), the operator's names given to ``ops`` and the names found in a
#: repository's files — and the value's own module. Everything else takes the value.
NAME_EDGES = ("cli.py", "config.py", "airflow/", "ops/", "contract/names.py")


def _name_checks(path: Path) -> list[int]:
    """Lines that check a model name: ``ModelName(...)`` calls, or a ``validate_model_name``/``names_for``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    hits = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in ("ModelName", "validate_model_name", "names_for"):
                hits.add(node.lineno)
        if isinstance(node, ast.FunctionDef) and node.name in ("validate_model_name", "names_for"):
            hits.add(node.lineno)
    return sorted(hits)


def test_a_model_name_is_checked_only_at_the_edges() -> None:
    found = {}
    for path in _modules():
        rel = _rel(path)
        if not rel.startswith(NAME_EDGES) and (lines := _name_checks(path)):
            found[rel] = lines
    assert not found, f"model names checked below the edges (take a ModelName instead): {found}"


def test_the_name_check_scan_sees_checks(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("a = ModelName(x)\nb = names.ModelName(y)\ndef names_for(m):\n    pass\nc = str(z)\n")
    assert _name_checks(probe) == [1, 2, 3]


def test_what_names_a_file_requires_a_checked_name() -> None:
    """The path builders refuse an unchecked string instead of checking it again."""
    from seqcls.contract.names import ModelName
    from seqcls.serving.state import state_path
    from seqcls.serving.statelog import log_path

    for build in (state_path, log_path):
        assert build(Path("/r"), ModelName("alpha")).parent == Path("/r")
        with pytest.raises(TypeError, match="unchecked str"):
            build(Path("/r"), "../alpha")


def test_no_package_is_a_lone_init() -> None:
    """A package is a room with modules in it, not one big ``__init__.py`` made to meet a count."""
    lone = [
        _rel(d)
        for d in sorted({p.parent for p in _modules()} - {PACKAGE})
        if not [p for p in d.glob("*.py") if p.name != "__init__.py"] and not list(d.glob("*/__init__.py"))
    ]
    assert not lone, f"packages that are only an __init__.py (make it a module of a package): {lone}"


def test_no_import_cycles_counting_function_level_imports() -> None:
    cycles = _cycles(_graph())
    assert not cycles, f"import cycles (a function-level import does not hide one): {cycles}"


def test_the_cycle_check_sees_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_private_name_is_imported_across_modules() -> None:
    found = []
    for path in [*_modules(), *sorted(TOOLS.rglob("*.py")), *sorted(DAGS.glob("*.py"))]:
        for module, line, _, imported in _imports(path):
            if module.startswith(("seqcls", "seqcls_tools")):
                found += [f"{path.relative_to(ROOT)}:{line} {module}.{n}" for n in imported if n.startswith("_")]
    found = [f for f in found if not f.endswith((".__version__", ".__all__"))]
    assert not found, f"private names imported from another module (make them public or move the code): {found}"


def test_function_level_seqcls_imports_only_for_heavy_optional_parts() -> None:
    found = []
    for path in _modules():
        rel = _rel(path)
        for module, line, in_function, _ in _imports(path):
            lazy_ok = module.startswith(LAZY_SEQCLS) and not rel.startswith("airflow/")
            if in_function and (module == "seqcls" or module.startswith("seqcls.")) and not lazy_ok:
                found.append(f"{rel}:{line} {module}")
    assert not found, f"function-level imports of seqcls modules (import at module level; fix the cycle): {found}"


def _framework_branches(path: Path) -> list[int]:
    """Lines that decide by framework: ``.is_transformers``, ``.framework ==/in``, framework string compares."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    hits = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("is_transformers", "is_paddle"):
            hits.add(node.lineno)
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any(isinstance(s, ast.Attribute) and s.attr == "framework" for s in sides)
            literal = any(
                isinstance(s, ast.Constant) and s.value in ("transformers", "paddlenlp", "paddle") for s in sides
            )
            if named or literal:
                hits.add(node.lineno)
    return sorted(hits)


def test_no_framework_branch_outside_the_framework_adapters() -> None:
    found = {}
    for path in _modules():
        rel = _rel(path)
        if rel.startswith(FRAMEWORK_HOME):
            continue
        lines = _framework_branches(path)
        if lines:
            found[rel] = lines
    assert not found, f"framework branches outside {FRAMEWORK_HOME} (add to the adapter protocol): {found}"


def test_the_framework_scan_sees_branches(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("if c.is_transformers:\n    pass\nx = c.framework == 'paddlenlp'\ny = kind in ('transformers',)\n")
    assert _framework_branches(probe) == [1, 3]


def test_step_modules_are_leaves() -> None:
    step_modules = {_module_name(p) for p in (PACKAGE / "steps").glob("*.py") if p.name != "__init__.py"}
    assert len(step_modules) > 5, step_modules
    found = []
    for path in _modules():
        rel = _rel(path)
        for module, line, _, imported in _imports(path):
            targets = [module, *(f"{module}.{n}" for n in imported)]
            steps = [t for t in targets if t in step_modules]
            if steps and not rel.startswith(STEP_IMPORTERS):
                found.append(f"{rel}:{line} {', '.join(steps)}")
    assert not found, f"modules importing a step module (move what they share to its owner): {found}"


def _durable_calls(path: Path) -> list[int]:
    """Lines that replace files or make temp files by hand: ``os.replace/rename``, ``tempfile.mkstemp``,
    one-argument ``.replace(x)``/``.rename(x)`` (``Path``'s; ``str.replace`` takes two)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    hits = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
        attr = node.func.attr
        if (owner, attr) in {("os", "replace"), ("os", "rename"), ("tempfile", "mkstemp")} or (
            owner not in ("os", "tempfile") and attr in ("replace", "rename") and len(node.args) == 1
        ):
            hits.add(node.lineno)
    return sorted(hits)


def test_files_are_replaced_only_through_the_one_durable_writer() -> None:
    found = {}
    for path in _modules():
        rel = _rel(path)
        if rel != DURABLE and (lines := _durable_calls(path)):
            found[rel] = lines
    assert _durable_calls(PACKAGE / DURABLE), f"{DURABLE} holds the durable writer; the scan must see it"
    assert not found, f"files replaced outside seqcls/{DURABLE} (use seqcls.files.atomic_write): {found}"


def test_no_test_module_imports_another() -> None:
    found = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for module, line, _, imported in _imports_any(path):
            targets = [f"{module}.{n}" for n in imported] if module == "tests" else [module]
            bad = [t for t in targets if t.startswith("tests.") and not t.startswith("tests.helpers")]
            found += [f"{path.name}:{line} {t}" for t in bad]
    assert not found, f"test modules importing other test modules (share through tests/helpers/): {found}"


def _imports_any(path: Path) -> list[tuple[str, int, bool, tuple[str, ...]]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, False, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.append((node.module or "", node.lineno, False, tuple(a.name for a in node.names)))
    return out
