"""Transitions checked before they are recorded; version numbers never reused; publish ships what was hashed.

Issue 23, scenarios 1, 2, 3 and 13 and the hash-checked publish. Unit tests build a repository of
fake versions on disk (no Triton: reconcile with no endpoint only writes configs); one drill per
scenario runs it against the real local Triton and sqlite MLflow, and ends in the invariant, the
same served answers after a Triton restart, and intact served/previous versions.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from seqcls.checkpoints.checkpoint import sha256_file
from seqcls.contract.names import CLASSIC
from seqcls.errors import SeqclsError, ServingError
from seqcls.release import control
from seqcls.release.intake import open_release
from seqcls.release.records import served_onnx, serving_tokenizer
from seqcls.serving.client import TritonOps, endpoints_from_settings
from seqcls.serving.reconcile import reconcile
from seqcls.serving.repository import RELEASE_FILE, SNAPSHOT, Repository
from seqcls.serving.state import ServingState, read_state, write_state
from seqcls.settings import Settings
from seqcls.steps import run_release
from seqcls.steps.publish import prune, publish
from seqcls.steps.rollback import rollback_model
from tests.helpers.drills import Drill, champion, repo_of, timed_sync, when, write_record

MODEL = CLASSIC.model_name
MODULE = "test_transitions"  # the drills record of this module (var/test-artifacts/drills-test_transitions.json)
SOURCE = Path(__file__).resolve().parents[1] / "model_repository"
TEXTS = ["天气很好", "the service was slow and the food cold", "退款还没到账", "x"]


# --- a repository of fake versions (no Triton) ----------------------------------------------------


def _fake_version(root: Path, version: int) -> None:
    for model in CLASSIC.models:
        vdir = root / model / str(version)
        vdir.mkdir(parents=True)
        (vdir / "weights.bin").write_bytes(f"{model}-{version}".encode())
        policy = f"version_policy: {{ specific: {{ versions: [ {version} ] }} }}"
        (vdir / SNAPSHOT).write_text(f'name: "{model}"\n{policy}\n', encoding="utf-8")
        files = {name: sha256_file(vdir / name) for name in ("weights.bin", SNAPSHOT)}
        info = {"version": version, "model": model, "publish_key": f"key{version}", "files": files}
        (vdir / RELEASE_FILE).write_text(json.dumps(info), encoding="utf-8")


def _released(root: Path, versions: list[int], on_disk: list[int]) -> Repository:
    """``versions`` released one after another (recorded), ``on_disk`` present in the repository."""
    state = ServingState.empty(MODEL)
    for v in versions:
        state = state.with_candidate(v, f"fp{v}", "test").promoted(v, f"fp{v}", "test")
    write_state(root, state, expected_generation=0)
    for v in on_disk:
        _fake_version(root, v)
    return Repository(root, root, CLASSIC)


@pytest.fixture
def no_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reconcile against no endpoint at all: it only writes the configs."""
    monkeypatch.setattr(control, "ops_for", lambda endpoints, **_: [])


def _rollback(repo: Repository) -> ServingState:
    _, after, report = control.transition(repo, MODEL, lambda s: s.rolled_back("test"), [], live_first=False)
    assert report.converged, report.errors
    return after


def test_rollbacks_past_a_pruned_version_refuse_with_nothing_changed(tmp_path: Path, no_triton: None) -> None:
    """Scenario 1: four releases, retain 3 pruned version 1; rollback #2 recorded it as previous."""
    repo = _released(tmp_path, [1, 2, 3, 4], on_disk=[2, 3, 4])
    assert (_rollback(repo).serving, read_state(tmp_path, MODEL).previous) == (3, 2)
    after = _rollback(repo)  # serves 2; its previous (1) is gone, so none is recorded
    assert (after.serving, after.previous) == (2, None)
    before = read_state(tmp_path, MODEL)
    with pytest.raises(ServingError, match="nothing to roll back to"):
        _rollback(repo)
    assert read_state(tmp_path, MODEL) == before


def test_rollback_to_a_damaged_version_refuses_naming_it(tmp_path: Path, no_triton: None) -> None:
    repo = _released(tmp_path, [1, 2], on_disk=[1, 2])
    (tmp_path / CLASSIC.model / "1" / "weights.bin").write_bytes(b"edited")
    before = read_state(tmp_path, MODEL)
    with pytest.raises(ServingError, match=r"version 1 .*changed since publish") as err:
        _rollback(repo)
    assert "seqcls sync" in str(err.value)
    assert read_state(tmp_path, MODEL) == before


def test_a_transition_drops_a_previous_that_is_gone(tmp_path: Path, no_triton: None) -> None:
    """A release goes on when the warm previous was deleted: the new state no longer names it."""
    repo = _released(tmp_path, [1, 2], on_disk=[2, 3])
    _, after, _ = control.transition(repo, MODEL, lambda s: s.with_candidate(3, "fp3", "test"), [], live_first=False)
    assert (after.serving, after.previous, after.candidate) == (2, None, 3)


def test_reconcile_serves_what_it_can_when_the_previous_is_missing(tmp_path: Path) -> None:
    """Scenario 2: the warm previous deleted — sync failed and a restarted Triton loaded nothing."""
    repo = _released(tmp_path, [1, 2], on_disk=[2])
    report = reconcile(repo, read_state(tmp_path, MODEL), [])
    assert "version 1" in " ".join(report.errors.values()), report.errors
    assert repo.live_versions(CLASSIC.ensemble) == [2] and repo.live_versions(CLASSIC.model) == [2]


class _RacingTriton:
    """Triton's model control as seen on an S3 repository: while a route (an ensemble) loads, Triton
    re-polls its steps, and a route unloaded meanwhile is loaded again beside it (its config from
    memory). Each ``unload`` bounces back ``bounces`` more times (loaded again right after it returns)."""

    def __init__(self, loaded: dict[str, list[int]], bounces: int = 0) -> None:
        self.loaded, self.bounces = loaded, bounces
        self.endpoint = SimpleNamespace(grpc="racing:8001")
        self.request_timeout, self.client = 5.0, self
        self.unloaded = threading.Event()
        self.calls: list[str] = []

    def require_live(self) -> None:
        pass

    def get_model_repository_index(self, as_json: bool, client_timeout: float) -> dict:
        ready = [(m, v) for m, vs in self.loaded.items() for v in vs]
        return {"models": [{"name": m, "version": str(v), "state": "READY"} for m, v in ready]}

    def repository_index(self, timeout: float | None = None) -> list[dict]:
        return self.get_model_repository_index(as_json=True, client_timeout=timeout or self.request_timeout)["models"]

    def load(self, model: str) -> None:
        self.calls.append(f"load {model}")
        if model in CLASSIC.routes:
            beside = {r: list(self.loaded.get(r, [])) for r in CLASSIC.routes if r != model and self.loaded.get(r)}
            self.unloaded.wait(0.5)  # an unload racing this load lands while Triton re-polls the steps
            for route, versions in beside.items():
                self.loaded[route] = self.loaded.get(route) or versions

    def verify_ready(self, model: str, versions: list[int]) -> None:
        self.loaded[model] = list(versions)

    def ready(self, model: str) -> bool:
        return bool(self.loaded.get(model))

    def unload(self, model: str) -> None:
        self.calls.append(f"unload {model}")
        if self.bounces:
            self.bounces -= 1
            return
        self.loaded[model] = []
        self.unloaded.set()


def _exposing(tmp_path: Path) -> tuple[Repository, dict[str, list[int]]]:
    """Version 3 recorded as served (1 previous), Triton still as reload left it: 1 public, 3 the candidate."""
    repo = _released(tmp_path, [1, 3], on_disk=[1, 3])
    loaded = {m: [1, 3] for m in CLASSIC.composing} | {CLASSIC.ensemble: [1], CLASSIC.candidate: [3]}
    return repo, loaded


def test_expose_unloads_the_candidate_route_after_the_public_route_loaded(tmp_path: Path) -> None:
    """A route unloaded while the other loads came back READY on Triton with an S3 repository (the
    takeover drill failed on it in CI): unloads wait for the loads."""
    repo, loaded = _exposing(tmp_path)
    triton = _RacingTriton(loaded)
    report = reconcile(repo, read_state(tmp_path, MODEL), [triton])
    assert report.converged, report.errors
    assert loaded[CLASSIC.ensemble] == [3] and loaded[CLASSIC.candidate] == [], (loaded, triton.calls)
    assert triton.calls.index(f"unload {CLASSIC.candidate}") > triton.calls.index(f"load {CLASSIC.ensemble}")


def test_a_route_that_comes_back_after_its_unload_is_unloaded_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repo, loaded = _exposing(tmp_path)
    triton = _RacingTriton(loaded, bounces=1)
    with caplog.at_level(logging.WARNING, logger="seqcls.serving.reconcile"):
        report = reconcile(repo, read_state(tmp_path, MODEL), [triton])
    assert report.converged, report.errors
    assert loaded[CLASSIC.candidate] == [] and triton.calls.count(f"unload {CLASSIC.candidate}") == 2
    assert f"{CLASSIC.candidate} [3]" in caplog.text


def test_prune_keeps_the_recorded_versions_and_the_next_rollbacks(tmp_path: Path) -> None:
    repo = _released(tmp_path, [1, 2, 3, 4, 5], on_disk=[1, 2, 3, 4, 5])
    state = read_state(tmp_path, MODEL).rolled_back("test").rolled_back("test")  # serving 3, previous 2
    write_state(tmp_path, state, expected_generation=read_state(tmp_path, MODEL).generation)
    removed = prune(repo, 2, read_state(tmp_path, MODEL))
    assert 2 in repo.complete_versions() and 3 in repo.complete_versions() and 5 in repo.complete_versions()
    assert set(removed) <= {1, 4}


def test_rollback_while_a_release_is_in_flight_refuses_at_once(tmp_path: Path, home: Path) -> None:
    """Scenario 13 (unit): the rollback waited for the lease, then rolled back what finished meanwhile."""
    settings = Settings(home=home, triton_repository=tmp_path / "repo", model_repository_source=SOURCE)
    _released(tmp_path / "repo", [1, 2], on_disk=[1, 2])
    owner = f"release:{MODEL}:0123456789abcdef:01234567"
    control.take_lease(tmp_path / "repo", MODEL, owner, "smoke")
    before = read_state(tmp_path / "repo", MODEL)
    t0 = time.monotonic()
    with (
        control.lease_context(control.LeaseContext(timeout=3)),
        pytest.raises(SeqclsError, match=f"a release of {MODEL} is in flight"),
    ):
        rollback_model(settings, MODEL)
    assert time.monotonic() - t0 < 2, "the rollback waited for the release instead of refusing"
    assert read_state(tmp_path / "repo", MODEL) == before
    control.give_lease(tmp_path / "repo", MODEL, owner)


# --- publish ships exactly the bytes intake and convert hashed ------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("which", ["onnx", "tokenizer"])
def test_publish_refuses_a_file_changed_since_it_was_hashed(
    which: str, tiny_checkpoint: Path, home: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "triton-repo"
    settings = Settings(home=home, triton_repository=repo, model_repository_source=SOURCE)
    release = open_release(tiny_checkpoint, settings=settings)
    run_release(release, until="evaluate")
    target = served_onnx(release.workspace) if which == "onnx" else serving_tokenizer(release).file
    data = target.read_bytes()
    target.unlink()
    target.write_bytes(data + b"\n")
    with pytest.raises(ServingError, match=target.name) as err:
        publish(release)
    assert "changed since" in str(err.value)
    assert not [p for p in repo.glob("*/*") if p.is_dir()], "a version was published"
    assert not list(repo.glob(".tmp-*"))


# --- drills: real Triton + sqlite MLflow -----------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _drill_record():
    yield
    write_record(MODULE)


def _answers(drill: Drill) -> tuple[str, list]:
    preds, probs = TritonOps(endpoints_from_settings(drill.settings)[0]).infer(TEXTS)
    return json.dumps(preds, sort_keys=True), probs.round(5).tolist()


def _restart_keeps_answers(drill: Drill, scenario: str, outcome: str) -> None:
    """The served answers for fixed texts are the same after a Triton restart and one sync."""
    before = _answers(drill)
    drill.server.stop()
    drill.server.start()
    results = timed_sync(drill.settings, scenario, outcome, module=MODULE)
    assert all(r.ok for r in results), [r.to_dict() for r in results]
    assert _answers(drill) == before


def _assert_intact(drill: Drill) -> None:
    state, repo = drill.state(), repo_of(drill.settings)
    for v in {state.serving, state.previous} - {None}:
        assert not repo.damaged_files(v), (v, repo.damaged_files(v))


def _delete_version(drill: Drill, version: int) -> None:
    for model in CLASSIC.models:
        shutil.rmtree(drill.repo / model / str(version))


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.drill
def test_drill_four_releases_then_three_rollbacks(drill: Drill, tiny_checkpoint_src, tiny_checkpoint_b_src):
    """Scenario 1: rollback #2 recorded a pruned previous, #3 a version that did not exist; then nothing served."""
    for threshold in (0.5, 0.4):  # four release keys → four Triton versions, two exports
        drill.release(tiny_checkpoint_src, threshold=threshold)
        drill.release(tiny_checkpoint_b_src, threshold=threshold)
    assert drill.state().serving == 4
    for expected in (3, 2, 1):  # each rollback records only versions that are complete and intact
        before = drill.state()
        try:
            served = rollback_model(drill.settings, MODEL)["serving_version"]
        except ServingError as exc:  # retention pruned version 1: refused, nothing changed
            assert expected == 1 and "nothing to roll back to" in str(exc), (expected, str(exc))
            assert drill.state() == before
            break
        assert served == expected
        _assert_intact(drill)
    with pytest.raises(ServingError, match="nothing to roll back to"):
        rollback_model(drill.settings, MODEL)
    final = drill.state().serving
    drill.assert_invariant(served=final)
    assert champion(drill.settings) == final
    _restart_keeps_answers(drill, "4 releases, 3 rollbacks", f"every rollback applied or refused, serving {final}")
    drill.assert_invariant(served=final)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.drill
def test_drill_warm_previous_deleted(drill: Drill, tiny_checkpoint_src, tiny_checkpoint_b_src):
    """Scenario 2: sync failed; after a restart the intact served version was not loaded either."""
    drill.release(tiny_checkpoint_src)
    drill.release(tiny_checkpoint_b_src)
    served = _answers(drill)
    _delete_version(drill, 1)
    results = timed_sync(drill.settings, "warm previous deleted", "served kept, previous reported", module=MODULE)
    assert results[0].serving == 2
    drill.server.stop()
    drill.server.start()
    results = timed_sync(drill.settings, "warm previous deleted + restart", "served loaded", module=MODULE)
    if 1 not in repo_of(drill.settings).complete_versions():  # not restored: reported, naming it
        assert "version 1" in json.dumps(results[0].to_dict()), results[0].to_dict()
    assert _answers(drill) == served
    drill.release(tiny_checkpoint_src, threshold=0.4)  # a release goes on; its state drops a gone previous
    assert drill.state().serving == 3
    drill.assert_invariant(served=3)
    assert champion(drill.settings) == 3
    _assert_intact(drill)
    _restart_keeps_answers(drill, "warm previous deleted, then released", "serving 3")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.drill
def test_drill_served_version_deleted_then_released(drill: Drill, tiny_checkpoint_src, tiny_checkpoint_b_src):
    """Scenario 3: publish reused the deleted number; after a restart Triton served other weights.

    Since pins (issue 37) the deleted served version is restored from its pin and workspace before publish;
    without a pin (a version published before pins) the release proceeds beside what Triton holds, saying so
    — either way never under the deleted number."""
    drill.release(tiny_checkpoint_src)
    drill.release(tiny_checkpoint_b_src)
    _delete_version(drill, 2)
    (drill.repo / f".seqcls-pins.{MODEL}.v2.json").unlink()  # nothing records it: no copy can be verified
    drill.release(tiny_checkpoint_src, threshold=0.4)
    assert 2 not in repo_of(drill.settings).versions()  # nothing was published under the deleted number
    state = drill.state()
    assert state.serving >= 3 and state.previous != 2, f"version number reused: {state.serving}"
    drill.assert_invariant(served=state.serving)  # champion agrees (its MLflow number is 4: 3 was the refused one)
    _assert_intact(drill)
    _restart_keeps_answers(drill, "served version deleted, then released", "refused; rollback + release")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.drill
def test_drill_rollback_asked_during_a_release_refuses(drill: Drill, tiny_checkpoint_src, tiny_checkpoint_b_src):
    """Scenario 13: the rollback waited, then rolled back the release that finished after it was asked."""
    drill.release(tiny_checkpoint_src)
    outcome: dict = {}

    def ask() -> None:
        try:
            outcome["result"] = rollback_model(drill.settings, MODEL, reason="asked during smoke")
        except SeqclsError as exc:
            outcome["error"] = str(exc)
        outcome["serving_when_answered"] = drill.state().serving

    watcher = when(lambda: drill.state().candidate is not None, ask)
    drill.release(tiny_checkpoint_b_src)
    watcher.join(timeout=120)
    assert "error" in outcome, outcome
    assert f"a release of {MODEL} is in flight" in outcome["error"] and "retry after it" in outcome["error"]
    assert outcome["serving_when_answered"] == 1
    drill.assert_invariant(served=2)
    assert champion(drill.settings) == 2
    _assert_intact(drill)
    _restart_keeps_answers(drill, "rollback asked during smoke", "refused; release served")
