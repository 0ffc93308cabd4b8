"""The README's promises that code can check, and the manual's tritonclient example (docs/serving-contract.md)
runs as written."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from seqcls.settings import PROJECT_ROOT
from tests.helpers.triton import cli_env

README = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
#: The page holding the request/response contract and its tritonclient example.
SERVING_CONTRACT = (PROJECT_ROOT / "docs" / "serving-contract.md").read_text(encoding="utf-8")
#: A labeled eval set for the tiny (random-weight) model: the first release judges it on floors alone.
TEXTS = [
    ("凌云航空确认优化研发部门人员，裁员比例约为3%。", "组织关系,组织关系##裁员"),
    ("星河科技完成新一轮融资，金额达五亿元。", "财经,财经##融资"),
    ("主队在决赛中逆转取胜，夺得本赛季冠军。", "体育,体育##夺冠"),
    ("两家公司宣布合作，新成员正式加盟集团。", "组织关系,组织关系##加盟"),
] * 13  # 52 texts: at least the 50 a quality verdict is taken on


def test_readme_has_exactly_the_two_commands() -> None:
    block = re.search(r"## Two commands\n.*?```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    assert "make test" in (PROJECT_ROOT / ".ci" / "run").read_text()


def _first_screen_commands() -> list[str]:
    """The seqcls commands of *Release your own checkpoint* (the first bash block of that section)."""
    section = README.split("## Release your own checkpoint\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.integration
def test_readme_first_screen_release_and_client_example_run(
    server, tiny_checkpoint: Path, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newcomer's path as written: release your own checkpoint with the CLI (against the session's
    Triton: `triton start` is what the server fixture did), status, history — then the client example."""
    commands = _first_screen_commands()
    assert commands[0] == ".venv/bin/seqcls triton start", commands
    mine = tmp_path / "my-checkpoint"
    shutil.copytree(tiny_checkpoint, mine)
    (mine / "test.txt").write_text("".join(f"{t}\t{lbl}\n" for t, lbl in TEXTS), encoding="utf-8")
    env = cli_env(server, tmp_path, monkeypatch)
    outputs = []
    for command in commands[1:]:
        argv = shlex.split(command.replace("my-checkpoint", str(mine)))
        argv[0] = str(PROJECT_ROOT / argv[0])
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (command, out.stdout, out.stderr[-3000:])
        outputs.append(out.stdout)
    assert outputs[0].strip().splitlines()[-1].startswith("seqcls: serving Triton v1 (MLflow v1) at "), outputs[0]
    assert outputs[1].startswith("seqcls: serving Triton v1 (MLflow v1)") and "✓ served == recorded" in outputs[1]
    assert "nothing → Triton v1 (MLflow v1)" in outputs[2]
    section = SERVING_CONTRACT.split("## Request and response", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    code = code.replace('"127.0.0.1:8001"', repr(server.config.grpc_url))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/serving-contract.md", "exec"), {})
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        payload = line[line.index("[") :]
        for item in json.loads(payload.replace("'", '"')):
            assert set(item) == {"label", "confidence"}
