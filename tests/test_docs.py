"""The manual (docs/, MkDocs Material) and the README: built strictly, short, linked, generated where it can drift."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from seqcls.settings import PROJECT_ROOT
from seqcls_tools.docs import reference

README = PROJECT_ROOT / "README.md"
DOCS = PROJECT_ROOT / "docs"
#: README is the front door: the manual holds the rest.
README_MAX_BYTES = 15_000
#: A file name, not an environment variable.
NOT_VARIABLES = {"SEQCLS_DONE"}


@pytest.fixture(scope="module")
def rendered() -> str:
    return reference.render()


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """Broken links, anchors and nav entries are warnings, and strict mode fails on them."""
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert out.returncode == 0, out.stderr[-4000:]
    page = (tmp_path / "site" / "configuration" / "index.html").read_text(encoding="utf-8")
    assert "SEQCLS_HOME" in page and reference.MARKER not in page, "the hook did not put the reference in"


def test_readme_is_short() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail to docs/"


def test_readme_keeps_the_two_commands_verbatim() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make demo    # the main job end to end on embedded defaults\n" in text
    assert "make test    # the test suite (exactly what CI runs: .ci/run)\n" in text


def test_readme_links_to_every_docs_page_and_only_to_existing_ones() -> None:
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)\s]*)?\)", README.read_text(encoding="utf-8"))
    assert links, "README links to no docs page"
    missing = sorted({link for link in links if not (PROJECT_ROOT / link).is_file()})
    assert not missing, f"README links to docs files that do not exist: {missing}"
    pages = {f"docs/{p.name}" for p in DOCS.glob("*.md")}
    unlinked = sorted(pages - set(links))
    assert not unlinked, f"README does not link to {unlinked}"


def _variables_in_code() -> set[str]:
    names: set[str] = set()
    for path in (PROJECT_ROOT / "plugins" / "seqcls").rglob("*.py"):
        names |= set(re.findall(r"\bSEQCLS_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    return names - NOT_VARIABLES


def test_every_environment_variable_the_code_names_is_in_the_reference(rendered: str) -> None:
    names = _variables_in_code()
    assert len(names) > 10, names  # the scan found them
    missing = sorted(n for n in names if f"`{n}`" not in rendered)
    assert not missing, f"not in the configuration reference (add them to seqcls.environment.ENVIRONMENT): {missing}"


def test_every_release_parameter_flag_and_subcommand_is_in_the_reference(rendered: str) -> None:
    from seqcls.config import FIELDS

    missing = [f.flag for f in FIELDS if f"`{f.flag}`" not in rendered]
    assert not missing, f"release parameter flags not in the reference: {missing}"
    subcommands = reference.subcommands()
    assert {"release", "status", "sync", "rollback", "monitor"} <= set(subcommands)
    absent = [
        name
        for name in subcommands
        if f"### seqcls {name}\n" not in rendered and f"| `seqcls {name}` |" not in rendered
    ]
    assert not absent, f"subcommands without a section or row in the reference: {absent}"


def test_every_run_param_and_models_file_key_is_in_the_reference(rendered: str) -> None:
    from seqcls.airflow import models_file
    from seqcls.airflow.params import run_params

    names = [*run_params("seqcls"), *models_file.MODEL_KEYS, *models_file.DEFAULT_KEYS, *models_file.TOP_KEYS]
    missing = [n for n in names if f"| `{n}` |" not in rendered]
    assert not missing, f"not in the reference: {missing}"


def test_a_models_file_key_without_a_description_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    from seqcls.airflow import models_file

    monkeypatch.setattr(models_file, "MODEL_KEYS", (*models_file.MODEL_KEYS, "brand_new_key"))
    with pytest.raises(KeyError, match="brand_new_key"):
        reference.render()


def test_the_hook_puts_the_reference_at_the_marker_and_refuses_a_page_without_it() -> None:
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location(
        "configuration_hook", PROJECT_ROOT / "tools/mkdocs_hooks/configuration.py"
    )
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = SimpleNamespace(file=SimpleNamespace(src_uri="configuration.md"))
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    out = hook.on_page_markdown(text, page, None, None)
    assert reference.MARKER not in out and "## Environment variables" in out
    with pytest.raises(ValueError, match="marker"):
        hook.on_page_markdown("# Configuration\n", page, None, None)
    other = SimpleNamespace(file=SimpleNamespace(src_uri="index.md"))
    assert hook.on_page_markdown("x", other, None, None) == "x"


def test_the_architecture_page_follows_the_step_table() -> None:
    """The step table and the `Steps:` line of docs/architecture.md name the steps of seqcls.steps, in order."""
    from seqcls.steps import EXTRA_STEPS, STEPS

    names = [s.name for s in (*STEPS, *EXTRA_STEPS)]
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| step | what it does | module |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line.strip("|").split(" | ")[0].strip())
    assert rows == ["resolve", *names]
    assert re.search(r"Steps: `([^`]+)`", text).group(1).split() == names
    assert any(line.startswith("| module | owns |") for line in lines)


def test_no_issue_numbers_or_session_asides() -> None:
    """The manual speaks to a reader, not to the project's tracker: no "(#26)", no "issue 26"."""
    pattern = re.compile(r"\(#\d+\)|\bissues? #?\d+|\b(?:this|last|earlier|previous) sessions?\b", re.I)
    hits = [
        f"{path.relative_to(PROJECT_ROOT)}: {m.group(0)}"
        for path in [README, *DOCS.rglob("*.md")]
        for m in pattern.finditer(path.read_text(encoding="utf-8"))
    ]
    assert not hits, hits
