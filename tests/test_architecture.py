"""The architecture's rules, asserted: size limits, no copies, and everything derived from one table.

- every module of the product package ``plugins/seqcls`` and of the development tools
  ``tools/seqcls_tools`` is at most :data:`MAX_MODULE_LINES` lines and every function at most
  :data:`MAX_FUNCTION_LINES` (no exemptions: a data table is a module-level constant, not a
  function, so it never counts against the function limit);
- ``duplicates`` finds no pair of copied blocks longer than 10 lines under ``plugins/`` or ``tools/``;
- the DAG's task chain, its Params and the CLI's subcommands and flags equal what the step table
  (:mod:`seqcls.steps`) and the config table (:mod:`seqcls.config`) produce;
- environment variables are read only in ``settings.py`` (and the local Triton runner).
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import private_airflow_home

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "plugins" / "seqcls"
TOOLS = ROOT / "tools" / "seqcls_tools"
DAGS = ROOT / "dags"
DAG_ID = "seqcls_release"
MAX_MODULE_LINES = 400
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
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them by responsibility): {over}"


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


@pytest.mark.parametrize("tree", ["plugins", "tools"])
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
    from seqcls.airflow import ROLLBACK_TASK, TASK_ORDER
    from seqcls.steps import STEPS

    assert set(dag.task_ids) == set(TASK_ORDER)
    chain_ids = set(TASK_ORDER) - {ROLLBACK_TASK}
    assert _linear_chain(dag, chain_ids) == [t for t in TASK_ORDER if t != ROLLBACK_TASK]
    undo = {s.task_id for s in STEPS if s.undo_on_failure}
    assert undo, "the step table marks no step undo_on_failure"
    assert dag.get_task(ROLLBACK_TASK).upstream_task_ids == undo
    assert not dag.get_task(ROLLBACK_TASK).downstream_task_ids


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
    from seqcls.airflow import TASK_ORDER
    from seqcls.steps import BY_NAME

    text = (ROOT / "scripts" / "airflow-tasks-test.py").read_text(encoding="utf-8")
    assert "TASK_ORDER" in text and "TASK_STEPS" in text
    quoted = set(re.findall(r"[\"']([a-z_]+)[\"']", text))
    copied = sorted(quoted & (set(TASK_ORDER) | set(BY_NAME)))
    assert not copied, f"task ids written out in the script: {copied}"


# ----------------------------------------------------------------------------- README from the tables


def _readme_architecture() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split("## Architecture\n", 1)[1].split("\n## ", 1)[0]


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


def test_readme_step_list_and_module_tables_follow_the_code() -> None:
    from seqcls.steps import EXTRA_STEPS, STEPS

    names = [s.name for s in (*STEPS, *EXTRA_STEPS)]
    section = _readme_architecture()
    steps = _table_rows(section, "| step | what it does | module |")
    assert [row[0] for row in steps] == ["resolve", *names], "README's step table is not the step table"
    cli_steps = re.search(r"Steps: `([^`]+)`", (ROOT / "README.md").read_text(encoding="utf-8")).group(1)
    assert cli_steps.split() == names, "README's `Steps:` list is not the step table"
    modules = [cell for row in steps for cell in row[-1].split(", ")]
    modules += [cell for row in _table_rows(section, "| module | owns |") for cell in row[0].split(", ")]
    missing = [m for m in modules if not (PACKAGE / m.strip("`")).exists()]
    assert not missing, f"README names modules that do not exist under plugins/seqcls: {missing}"
