"""The README's promises that code can check: its tritonclient example runs as written."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from seqcls.settings import PROJECT_ROOT
from seqcls.steps import run_release
from seqcls.workspace import open_release
from tests.helpers.triton import settings_for

README = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_has_exactly_the_two_commands() -> None:
    block = re.search(r"## Two commands\n.*?```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    assert "make test" in (PROJECT_ROOT / ".ci" / "run").read_text()


@pytest.mark.slow
@pytest.mark.integration
def test_readme_client_example_runs(server, tiny_checkpoint: Path, home: Path) -> None:
    run_release(open_release(tiny_checkpoint, settings=settings_for(server, home)))
    section = README.split("## The served model: request / response contract", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    code = code.replace('"127.0.0.1:8001"', repr(server.config.grpc_url))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        payload = line[line.index("[") :]
        for item in json.loads(payload.replace("'", '"')):
            assert set(item) == {"label", "confidence"}
