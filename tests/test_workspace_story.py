"""What a re-run says (issue 25): a step skipped when nothing changed, "redoing" only with the reason —
which inputs changed, or which outputs were damaged — and never for steps that re-check by design."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from seqcls.contract.names import ModelName
from seqcls.release.workspace import Workspace


def _body(text: str):
    def body(out: Path) -> tuple[dict, str]:
        (out / "a.txt").write_text(text)
        return {}, "wrote a.txt"

    return body


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [
        r.getMessage() for r in caplog.records if r.name == "seqcls.release.workspace" and r.levelno >= logging.INFO
    ]
    caplog.clear()
    return lines


def test_a_rerun_says_why_it_redoes_a_step(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="seqcls.release.workspace")
    ws = Workspace(tmp_path / "ws")
    ws.run_step("export", {"opset": 14, "max_length": 64}, _body("1"), out_dir="static")
    _said(caplog)
    assert ws.run_step("export", {"opset": 14, "max_length": 64}, _body("1"), out_dir="static").status == "skipped"
    assert not any("redoing" in line for line in _said(caplog))

    ws.run_step("export", {"opset": 14, "max_length": 128}, _body("2"), out_dir="static")
    assert "export: inputs changed (max_length) since its last run — redoing" in _said(caplog)

    (ws.root / "static" / "a.txt").write_text("tampered")
    ws.run_step("export", {"opset": 14, "max_length": 128}, _body("2"), out_dir="static")
    assert "export: outputs missing or changed (static/a.txt) since its last run — redoing" in _said(caplog)


def test_steps_that_recheck_every_time_do_not_claim_to_redo(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="seqcls.release.workspace")
    ws = Workspace(tmp_path / "ws")
    for _ in range(2):
        ws.run_step("reload", {"version": 1}, _body("1"), out_dir="reload", always_run=True)
    assert not any("redoing" in line for line in _said(caplog))


def test_status_cuts_a_long_error_at_a_word_and_names_versions_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import seqcls.ops.status as status_mod
    from seqcls.serving.state import ServingState, write_state
    from seqcls.settings import Settings

    settings = Settings.from_env(
        home=tmp_path / "home", triton_repository=tmp_path / "repo", triton_grpc=("127.0.0.1:9",)
    )
    write_state(
        settings.triton_repository,
        ServingState.empty(ModelName("seqcls")).with_candidate(3, "a" * 64, "x"),
        expected_generation=0,
    )

    def down(_settings):
        raise ConnectionError("MLflow at http://mlflow:5000 refused the connection " + "because it is restarting " * 20)

    monkeypatch.setattr(status_mod, "client", down)
    (report,) = status_mod.status(settings, ["seqcls"])
    text = "\n".join(report.lines())
    assert text.startswith("seqcls: serving none; previous none; candidate Triton v3"), text
    mlflow_line = next(line for line in report.lines() if line.startswith("  MLflow:"))
    assert "…" in text and text.count("…") == text.count(" …"), text  # cut after a whole word, never "Failed to conne"
    assert mlflow_line.endswith(" is …)"), mlflow_line  # a whole word, then the ellipsis — never "restar…"
