"""The suite's own reporting: a failed test whose real Triton died shows why (the server's log tail)."""

from __future__ import annotations

from pathlib import Path

from seqcls.localtriton import LocalTriton, TritonServerConfig
from tests.helpers.triton import dead_triton_sections


def test_a_dead_triton_contributes_its_log_tail(tmp_path: Path) -> None:
    server = LocalTriton(TritonServerConfig(repository=tmp_path / "repo", state_dir=tmp_path / "state"))
    server.log_path.parent.mkdir(parents=True)
    server.log_path.write_text("I... loading\nterminate called after throwing 'X'\nSignal (6) received.\n")
    sections = dead_triton_sections({"triton": server, "other": 1})
    assert [title for title, _ in sections] == ["tritonserver log tail (triton: no longer running)"]
    assert "Signal (6) received." in sections[0][1]
