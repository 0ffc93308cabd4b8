"""The suite's own reporting: a failed test whose real Triton died shows why (the server's log tail)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from seqcls.localtriton import LocalTriton, TritonServerConfig
from tests.conftest import pytest_runtest_makereport


def _report(funcargs: dict[str, object], failed: bool) -> SimpleNamespace:
    report = SimpleNamespace(failed=failed, sections=[])
    hook = pytest_runtest_makereport(SimpleNamespace(funcargs=funcargs), None)
    next(hook)
    with pytest.raises(StopIteration):
        hook.send(SimpleNamespace(get_result=lambda: report))
    return report


def test_a_failed_test_whose_triton_died_carries_the_log_tail(tmp_path: Path) -> None:
    server = LocalTriton(TritonServerConfig(repository=tmp_path / "repo", state_dir=tmp_path / "state"))
    server.log_path.parent.mkdir(parents=True)
    server.log_path.write_text("I... loading\nterminate called after throwing 'X'\nSignal (6) received.\n")
    report = _report({"triton": server, "other": 1}, failed=True)
    assert [title for title, _ in report.sections] == ["tritonserver log tail (triton: no longer running)"]
    assert "Signal (6) received." in report.sections[0][1]
    assert _report({"triton": server}, failed=False).sections == []  # a passing test's report is untouched
