"""``seqcls gc`` with fakes: a release home of hand-made workspaces, a Triton repository of release.json files
and a recorded state, MLflow's aliases faked — what is collected, what is kept and why, crash safety."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqcls.ops import gc as gc_mod
from seqcls.ops.disk import HEAVY, disk_use
from seqcls.ops.gc import gc
from seqcls.ops.trash import leftovers, trash_root
from seqcls.serving.lease import ReleaseLease
from seqcls.serving.state import ServingState, write_state
from seqcls.settings import Settings
from tests.helpers.gc import HEAVY_BYTES, NAME, check_models_file_param
from tests.helpers.gc import fp as _fp
from tests.helpers.gc import publish as _publish
from tests.helpers.gc import serve as _serve
from tests.helpers.gc import workspace as _workspace


@pytest.fixture
def settings(home: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setattr(gc_mod, "_registry_fingerprints", lambda settings, model: {})
    monkeypatch.setenv("SEQCLS_GC_MLFLOW_VERSIONS", "keep")  # MLflow faked here; its versions: test_gc_mlflow.py
    return Settings.from_env()


def _items(result, model: str = NAME) -> dict[str, list]:
    m = next(m for m in result.models if m.model_name == model)
    out: dict[str, list] = {}
    for item in m.items:
        out.setdefault(Path(item.path).name if item.kind != "failed" or item.collect else "failed-kept", []).append(
            item
        )
    return out


def test_the_dry_run_says_what_goes_and_why_the_rest_stays_and_deletes_nothing(settings: Settings) -> None:
    for i in range(1, 7):
        _workspace(settings, i)
    _publish(settings, 5, 5)
    _publish(settings, 6, 6)
    _serve(settings, (5, 5), (6, 6))
    result = gc(settings)
    assert not result.apply and result.ok
    by_ws = {Path(i.path).name: i for m in result.models for i in m.items if i.kind == "workspace"}
    kept = {name: i.reasons for name, i in by_ws.items() if not i.collect}
    collected = {name for name, i in by_ws.items() if i.collect}
    assert collected == {_fp(i)[:16] for i in (1, 2, 3, 4)}
    assert any("served Triton v6" in r for r in kept[_fp(6)[:16]]), kept
    assert any("previous Triton v5" in r for r in kept[_fp(5)[:16]]), kept
    assert result.freed()["workspace"] == 4 * 3 * HEAVY_BYTES
    for i in range(1, 7):  # nothing deleted
        assert all((settings.releases_dir / NAME / _fp(i)[:16] / h).is_dir() for h in HEAVY[:3])
    assert "would free" in result.lines()[0] and "served Triton v6" in "\n".join(result.lines())


def test_apply_collects_heavy_artifacts_and_keeps_each_release_s_evidence(settings: Settings) -> None:
    old = [_workspace(settings, i) for i in (1, 2)]
    _workspace(settings, 3)
    _publish(settings, 1, 3)
    _serve(settings, (1, 3))
    result = gc(settings, apply=True)
    assert result.ok and result.freed()["workspace"] == 2 * 3 * HEAVY_BYTES
    for ws in old:
        assert not any((ws / h).exists() for h in HEAVY)
        assert (ws / "parity" / "report.json").is_file()  # the evidence stays
        manifest = json.loads((ws / "manifest.json").read_text())
        assert manifest["steps"]["validate"]["status"] == "ok"
        assert set(manifest["gc"]["collected"]) == {"checkpoint", "static", "onnx"}
    served = settings.releases_dir / NAME / _fp(3)[:16]
    assert all((served / h).is_dir() for h in HEAVY[:3])
    assert not leftovers(settings) and not any(trash_root(settings).glob("*"))
    assert gc(settings).freed()["workspace"] == 0  # idempotent: nothing left to collect


def test_rollback_targets_within_retain_published_versions_and_the_champion_are_kept(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(1, 9):
        _workspace(settings, i)
    for v in (4, 5, 6):
        _publish(settings, v, v)
    _serve(settings, (2, 2), (3, 3), (4, 4), (5, 5), (6, 6))  # v2 and v3 are no longer in the repository
    monkeypatch.setattr(gc_mod, "_registry_fingerprints", lambda s, m: {_fp(7)[:16]: "MLflow previous-champion (v2)"})
    result = gc(settings, retain=3)
    kept = {Path(i.path).name: i.reasons for m in result.models for i in m.items if not i.collect}
    assert any("rollback target Triton v4" in r for r in kept[_fp(4)[:16]]), kept
    assert any("rollback target Triton v3" in r for r in kept[_fp(3)[:16]]), kept  # the 2nd rollback's previous
    assert any("previous-champion" in r for r in kept[_fp(7)[:16]]), kept
    collected = {Path(i.path).name for m in result.models for i in m.items if i.collect}
    assert collected == {_fp(i)[:16] for i in (1, 2, 8)}, collected


def test_the_newest_refused_attempts_keep_their_evidence_the_others_do_not(settings: Settings) -> None:
    refused = [_workspace(settings, i, refused=f"2026-01-0{i}T00:00:00+00:00") for i in range(1, 5)]
    result = gc(settings, apply=True, keep_refused=2)
    assert result.ok
    assert [(ws / "failed").exists() for ws in refused] == [False, False, True, True]
    assert not any((ws / h).exists() for ws in refused for h in HEAVY)  # evidence is the small files only
    reasons = [r for m in result.models for i in m.items if not i.collect for r in i.reasons]
    assert sum("newest 2 refused" in r for r in reasons) == 2, reasons


def test_a_recent_or_locked_workspace_is_left_alone(settings: Settings) -> None:
    recent = _workspace(settings, 1)
    os.utime(recent / "manifest.json")  # just written: a release may be between two of its steps
    busy = _workspace(settings, 2)
    from seqcls.release.workspace import Workspace

    with Workspace(busy).lock():
        result = gc(settings, apply=True)
    assert all((recent / h).is_dir() for h in HEAVY[:3]) and all((busy / h).is_dir() for h in HEAVY[:3])
    reasons = " ".join(r for m in result.models for i in m.items for r in i.reasons)
    assert "a release may be between steps" in reasons and "in use" in reasons, reasons


def test_eval_set_copies_go_when_no_kept_workspace_refers_to_them(settings: Settings) -> None:
    settings.eval_sets_dir.mkdir(parents=True)
    for name in ("aaa.txt", "bbb.txt"):
        (settings.eval_sets_dir / name).write_text("t\tl\n" * 100)
        os.utime(settings.eval_sets_dir / name, (1_000_000_000, 1_000_000_000))
    _workspace(settings, 1, evalset="aaa.txt")
    _workspace(settings, 2, evalset="bbb.txt")
    _publish(settings, 1, 2)
    _serve(settings, (1, 2))
    result = gc(settings, apply=True)
    assert not (settings.eval_sets_dir / "aaa.txt").exists()
    assert (settings.eval_sets_dir / "bbb.txt").is_file()  # the served release was judged on it
    assert result.freed()["evalset"] == 400


def test_gc_refuses_a_model_whose_release_lease_is_held_and_collects_nothing_of_it(settings: Settings) -> None:
    ws = _workspace(settings, 1)
    lease = ReleaseLease(Path(str(settings.triton_repository)), NAME)
    with lease.hold("release:seqcls:someone", heartbeat=False):
        result = gc(settings, apply=True)
    assert not result.ok
    assert "held by release:seqcls:someone" in result.models[0].error
    assert all((ws / h).is_dir() for h in HEAVY[:3])
    out = subprocess.run(
        [sys.executable, "-m", "seqcls.cli", "gc", "--apply"], capture_output=True, text=True, env=os.environ.copy()
    )  # lease free again: the CLI collects
    assert out.returncode == 0, out.stderr[-2000:]
    assert not any((ws / h).exists() for h in HEAVY)


def test_a_gc_killed_between_move_and_delete_leaves_only_trash_the_next_gc_or_sync_removes(
    settings: Settings,
) -> None:
    ws = _workspace(settings, 1)
    env = {**os.environ, "SEQCLS_FAULT_PLAN": "die@gc:before-delete"}
    out = subprocess.run([sys.executable, "-m", "seqcls.cli", "gc", "--apply"], capture_output=True, text=True, env=env)
    assert out.returncode == -9, out.stderr[-2000:]
    assert not any((ws / h).exists() for h in HEAVY)  # moved aside whole, recorded
    assert json.loads((ws / "manifest.json").read_text())["gc"]["collected"]
    trash = leftovers(settings)
    assert trash and sum(1 for _ in trash[0].iterdir()) == 3
    dry = gc(settings)
    assert [i.kind for i in dry.home] == ["leftover"]
    from seqcls.ops.sync import sync

    sync(settings)  # no model recorded: it still finishes the interrupted gc
    assert not leftovers(settings)


def test_a_gc_killed_after_the_first_move_leaves_a_workspace_the_next_gc_finishes(settings: Settings) -> None:
    ws = _workspace(settings, 1)
    env = {**os.environ, "SEQCLS_FAULT_PLAN": "die@gc:after-move"}
    out = subprocess.run([sys.executable, "-m", "seqcls.cli", "gc", "--apply"], capture_output=True, text=True, env=env)
    assert out.returncode == -9, out.stderr[-2000:]
    assert sum((ws / h).exists() for h in HEAVY[:3]) == 2  # one moved whole, two untouched: none half
    result = gc(settings, apply=True)
    assert result.ok and not any((ws / h).exists() for h in HEAVY) and not leftovers(settings)


def test_status_reports_disk_use_per_kind(settings: Settings) -> None:
    _workspace(settings, 1, refused="2026-01-01T00:00:00+00:00")
    use = disk_use(settings, NAME)
    assert (use.workspaces, use.heavy) == (1, 3 * HEAVY_BYTES)
    assert use.failed == 2 and use.evidence > 0
    assert "disk:" in use.line() and "heavy 0.15 MB" in use.line()


def test_keep_refused_must_not_be_negative(settings: Settings) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "seqcls.cli", "gc", "--keep-refused", "-1"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "--keep-refused" in out.stderr


def test_after_promote_collects_with_the_run_s_keep_refused_and_never_raises(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from types import SimpleNamespace

    refused = [_workspace(settings, i, refused=f"2026-01-0{i}T00:00:00+00:00") for i in range(1, 4)]
    monkeypatch.setattr(gc_mod.control, "release_owner", lambda release: "release:seqcls:0123456789abcdef:01234567")
    release = SimpleNamespace(config=SimpleNamespace(model_name=NAME), settings=settings)
    done = gc_mod.after_promote(release, keep_refused=1)  # type: ignore[arg-type]
    assert done is not None and done.ok
    assert [(ws / "failed").exists() for ws in refused] == [False, False, True]
    assert ReleaseLease(Path(str(settings.triton_repository)), NAME).holder() is None  # given back

    def broken(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(gc_mod, "gc", broken)
    assert gc_mod.after_promote(release) is None  # type: ignore[arg-type]
    assert "gc after promote of seqcls failed (the release is not affected): disk gone" in caplog.text


def test_keep_refused_is_a_dag_param_and_a_models_file_default(tmp_path: Path) -> None:
    from seqcls.airflow.params import run_params

    assert run_params("seqcls")["keep_refused"]["default"] is None
    check_models_file_param(
        tmp_path, "keep_refused", 2, "-1", r"params\.keep_refused: keep_refused must be a whole number ≥ 0"
    )


def test_the_candidate_of_a_release_in_flight_or_awaiting_approval_is_kept(settings: Settings) -> None:
    _workspace(settings, 1)
    _workspace(settings, 2)
    _publish(settings, 1, 1)
    _publish(settings, 2, 2)
    state = (
        ServingState.empty(NAME).with_candidate(1, _fp(1), "t").promoted(1, _fp(1), "t").with_candidate(2, _fp(2), "t")
    )
    write_state(Path(str(settings.triton_repository)), state, expected_generation=0)
    result = gc(settings)
    kept = {Path(i.path).name: i.reasons for m in result.models for i in m.items if not i.collect}
    assert any("candidate Triton v2 (a release in flight or awaiting approval)" in r for r in kept[_fp(2)[:16]])
    assert result.freed()["workspace"] == 0


def test_mlflow_unreadable_collects_nothing_of_the_model(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    from seqcls.errors import RegistryError

    ws = _workspace(settings, 1)

    def down(settings, model):
        raise RegistryError("MLflow at sqlite:///x: unreachable")

    monkeypatch.setattr(gc_mod, "_registry_fingerprints", down)
    result = gc(settings, apply=True)
    assert not result.ok and "unreachable" in result.models[0].error
    assert all((ws / h).is_dir() for h in HEAVY[:3])  # it cannot tell which version is champion


def test_a_time_budget_leaves_the_rest_for_the_next_gc(settings: Settings) -> None:
    workspaces = [_workspace(settings, i) for i in (1, 2)]
    result = gc(settings, apply=True, budget=0.0)
    assert result.models[0].deferred == 2 and result.freed()["workspace"] == 0
    assert all((ws / h).is_dir() for ws in workspaces for h in HEAVY[:3])
    assert "2 more left for the next gc" in "\n".join(result.lines())
