"""``seqcls gc``'s evidence horizon with fakes: releases older than the newest ``evidence_keep`` and kept for no
other reason are compacted into one compressed audit record each; a kill -9 between writing the record and
removing the originals is finished by the next gc."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqcls.ops import gc as gc_mod
from seqcls.ops.disk import disk_use
from seqcls.ops.evidence import audit_path, read_record
from seqcls.ops.gc import gc
from seqcls.ops.trash import leftovers
from seqcls.settings import Settings
from tests.helpers.gc import NAME, check_models_file_param
from tests.helpers.gc import fp as _fp
from tests.helpers.gc import publish as _publish
from tests.helpers.gc import serve as _serve
from tests.helpers.gc import workspace as _workspace


@pytest.fixture
def settings(home: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setattr(gc_mod, "_registry_fingerprints", lambda settings, model: {})
    monkeypatch.setenv("SEQCLS_GC_MLFLOW_VERSIONS", "keep")  # MLflow faked here
    return Settings.from_env()


def _release(settings: Settings, i: int, **kwargs) -> Path:
    """A finished workspace with the evidence a real release leaves: reports, a plot, an HTML page."""
    ws = _workspace(settings, i, **kwargs)
    (ws / "evaluate").mkdir()
    (ws / "evaluate" / "evaluation.json").write_text(json.dumps({"verdict": "accepted", "micro_f1": 0.9 + i / 1000}))
    (ws / "evaluate" / "quality.png").write_bytes(b"\x89PNG" + b"p" * 4000)
    (ws / "parity" / "parity.html").write_text("<html>" + "h" * 4000 + "</html>")
    (ws / "parity" / "expected.json").write_text(json.dumps({"texts": ["t"] * 200, "logits": [[0.5] * 7] * 200}))
    return ws


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seqcls.cli", "gc", *args], capture_output=True, text=True, env={**os.environ, **env}
    )


def test_releases_beyond_the_horizon_are_compacted_into_one_audit_record_each(settings: Settings) -> None:
    wss = {i: _release(settings, i) for i in range(1, 9)}
    _publish(settings, 2, 8)
    _serve(settings, (1, 2), (2, 8))  # 8 served, 2 previous: kept whatever their age
    result = gc(settings, apply=True, evidence_keep=3)
    assert result.ok
    compacted = {i for i, ws in wss.items() if not ws.exists()}
    assert compacted == {1, 3, 4, 5}, compacted  # 6, 7, 8: the newest 3; 2: previous Triton v1
    for i in (2, 6, 7, 8):
        assert (wss[i] / "evaluate" / "quality.png").is_file() and not audit_path(settings, NAME, _fp(i)[:16]).exists()
    record = read_record(audit_path(settings, NAME, _fp(1)[:16]))
    assert record is not None and record["manifest"]["fingerprint"] == _fp(1)
    assert record["manifest"]["steps"]["validate"]["status"] == "ok"
    files = record["files"]
    assert files["evaluate/evaluation.json"]["json"]["verdict"] == "accepted"
    assert files["parity/report.json"]["json"] == {}
    assert files["evaluate/quality.png"]["dropped"] and len(files["evaluate/quality.png"]["sha256"]) == 64
    assert "text" not in files["parity/parity.html"] and files["parity/parity.html"]["dropped"]
    expected = files["parity/expected.json"]  # the reference answers: named with their hash, not kept
    assert expected["dropped"] and "json" not in expected and len(expected["sha256"]) == 64 and expected["bytes"] > 0
    assert set(record["manifest"]["gc"]["collected"]) == {"checkpoint", "static", "onnx"}  # heavy went first
    assert gzip.decompress(audit_path(settings, NAME, _fp(1)[:16]).read_bytes())  # one gzip file
    assert not leftovers(settings)
    use = disk_use(settings, NAME)
    assert use.compacted == 4 and use.audit > 0 and use.workspaces == 4
    assert "4 compacted" in use.line()
    again = gc(settings, apply=True, evidence_keep=3)  # idempotent
    assert not any(i.collect for m in again.models for i in m.items if i.kind == "evidence")


def test_the_dry_run_says_which_releases_would_be_compacted_and_why_and_deletes_nothing(settings: Settings) -> None:
    wss = {i: _release(settings, i) for i in range(1, 5)}
    result = gc(settings, evidence_keep=2)
    items = [i for m in result.models for i in m.items if i.kind == "evidence" and i.collect]
    assert {Path(i.path).name for i in items} == {_fp(1)[:16], _fp(2)[:16]}
    text = "\n".join(result.lines())
    assert "older than the newest 2 releases" in text and "compacted into" in text, text
    assert all(ws.is_dir() for ws in wss.values())
    assert not any(audit_path(settings, NAME, _fp(i)[:16]).exists() for i in wss)
    gc(settings, apply=True, evidence_keep=2)
    after = "\n".join(gc(settings, evidence_keep=2).lines())
    assert "2 compacted releases" in after, after


def test_the_newest_refused_attempts_and_recent_workspaces_are_not_compacted(settings: Settings) -> None:
    refused = _release(settings, 1, refused="2026-01-02T00:00:00+00:00")
    recent = _release(settings, 2)
    os.utime(recent / "manifest.json")  # written just now: a release may be between steps
    old = _release(settings, 3)
    for i in (4, 5):
        _release(settings, i)
    result = gc(settings, apply=True, evidence_keep=1, keep_refused=1)
    assert result.ok
    assert (refused / "failed").is_dir() and recent.is_dir() and not old.exists()


def test_evidence_keep_default_is_thirty(settings: Settings) -> None:
    wss = [_release(settings, i) for i in range(1, 32)]
    gc(settings, apply=True)
    assert [ws.exists() for ws in wss] == [False] + [True] * 30


def test_a_gc_killed_between_the_audit_record_and_the_removal_is_finished_by_the_next_gc(
    settings: Settings,
) -> None:
    old = _release(settings, 1)
    _release(settings, 2)
    out = _cli("--apply", "--evidence-keep", "1", SEQCLS_FAULT_PLAN="die@gc:evidence-written")
    assert out.returncode == -9, out.stderr[-2000:]
    record = audit_path(settings, NAME, _fp(1)[:16])
    assert record.is_file() and old.is_dir() and (old / "manifest.json").is_file()  # both: nothing lost
    dry = "\n".join(gc(settings, evidence_keep=1).lines())
    assert "interrupted" in dry, dry
    assert _cli("--apply", "--evidence-keep", "1").returncode == 0
    assert not old.exists() and read_record(record)["manifest"]["fingerprint"] == _fp(1)
    assert not leftovers(settings)


def test_a_gc_killed_after_moving_a_compacted_workspace_aside_leaves_trash_sync_removes(settings: Settings) -> None:
    old = _release(settings, 1)
    _release(settings, 2)
    out = _cli("--apply", "--evidence-keep", "1", SEQCLS_FAULT_PLAN="die@gc:before-delete")
    assert out.returncode == -9, out.stderr[-2000:]
    assert not old.exists() and read_record(audit_path(settings, NAME, _fp(1)[:16])) is not None
    assert leftovers(settings)
    from seqcls.ops.sync import sync

    sync(settings)
    assert not leftovers(settings)


def test_evidence_keep_is_a_flag_a_setting_a_dag_param_and_a_models_file_default(
    tmp_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seqcls.airflow.params import run_params
    from seqcls.errors import InputError

    assert settings.gc_evidence_keep == 30
    monkeypatch.setenv("SEQCLS_GC_EVIDENCE_KEEP", "7")
    assert Settings.from_env().gc_evidence_keep == 7
    monkeypatch.setenv("SEQCLS_GC_EVIDENCE_KEEP", "-1")
    with pytest.raises(InputError, match="SEQCLS_GC_EVIDENCE_KEEP"):
        Settings.from_env()
    assert run_params("seqcls")["evidence_keep"]["default"] is None
    check_models_file_param(tmp_path, "evidence_keep", 10, "x", r"params\.evidence_keep")
    out = subprocess.run([sys.executable, "-m", "seqcls.cli", "gc", "--evidence-keep", "-1"], capture_output=True)
    assert out.returncode == 2 and b"--evidence-keep" in out.stderr


def test_history_and_status_say_which_releases_were_compacted(settings: Settings) -> None:
    from seqcls.ops.history import history, lines

    for i in range(1, 6):
        _release(settings, i)
    for v in (4, 5):
        _publish(settings, v, v)
    _serve(settings, (1, 1), (2, 2), (3, 3), (4, 4), (5, 5))
    gc(settings, apply=True, evidence_keep=1, retain=2)  # v3, v4: rollback targets; v5 served
    found = history(settings, [NAME])
    compacted = {e.fingerprint[:16] for e in found.entries if e.evidence == "compacted"}
    assert compacted == {_fp(i)[:16] for i in (1, 2)}, [(e.fingerprint, e.evidence) for e in found.entries]
    text = "\n".join(lines(found))
    assert f"{_fp(1)[:12]} (compacted)" in text and f"{_fp(5)[:12]} (compacted)" not in text, text


def test_after_promote_compacts_with_the_run_s_evidence_keep(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    wss = [_release(settings, i) for i in range(1, 4)]
    monkeypatch.setattr(gc_mod.control, "release_owner", lambda release: "release:seqcls:0123456789abcdef:01234567")
    release = SimpleNamespace(config=SimpleNamespace(model_name=NAME), settings=settings)
    done = gc_mod.after_promote(release, evidence_keep=2)  # type: ignore[arg-type]
    assert done is not None and done.ok
    assert [ws.exists() for ws in wss] == [False, True, True]
