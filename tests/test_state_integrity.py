"""Issue 23, state integrity: version counter, rollback-protected versions, pinned history, the
append-only log, corrupt state/lease files that stay one model's problem, lost-state reconstruction.

Unit tests use tmp dirs; the drills (marked slow/integration/drill) use the real Triton + sqlite
MLflow of tests/helpers/drills.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from seqcls.checkpoints.checkpoint import sha256_file
from seqcls.cli import main
from seqcls.contract.names import ModelName
from seqcls.errors import LeaseError, ServingError
from seqcls.ops.status import status
from seqcls.ops.sync import models_in, sync
from seqcls.serving import state as state_file
from seqcls.serving.lease import ReleaseLease
from seqcls.serving.state import ServingState, current_state, read_state, state_path, write_state
from seqcls.settings import Settings
from tests.helpers.drills import Drill, drill_test, served_answers, timed_sync, write_record

NAME = ModelName("seqcls")
GARBAGE = {
    "binary": b"\xff\xfe\x00\x81garbage\x9c",
    "wrong JSON": b'{"model_name": "alpha", "serving": ',
    "wrong schema": b'{"model_name": "alpha", "serving": [1], "previous": null, "candidate": null, "generation": 1}',
    "not an object": b"[1, 2, 3]",
}


def _released(*versions: int, name: str = NAME) -> ServingState:
    s = ServingState.empty(name)
    for v in versions:
        s = s.with_candidate(v, f"fp{v}", "run-test").promoted(v, f"fp{v}", "run-test")
    return s


# ---------------------------------------------------------------------------- version counter


def test_allocated_raises_the_counter_and_refuses_reuse() -> None:
    s = ServingState.empty(NAME).allocated(3)
    assert s.published == 3
    with pytest.raises(ServingError, match="never reused"):
        s.allocated(3)
    with pytest.raises(ServingError, match="already allocated"):
        s.allocated(2)
    assert s.allocated(7).published == 7


def test_published_round_trips_and_never_decreases() -> None:
    s = _released(1, 2).allocated(9)
    back = ServingState.from_dict(s.to_dict())
    assert back.published == 9
    assert back.with_candidate(3, "fp3", "t").published == 9  # a lower candidate does not lower it


def test_published_is_derived_for_a_file_written_before_the_counter() -> None:
    d = _released(1, 4).to_dict()
    del d["published"]
    assert ServingState.from_dict(d).published == 4
    empty = ServingState.empty(NAME).to_dict()
    del empty["published"]
    assert ServingState.from_dict(empty).published == 0


def test_published_below_named_versions_is_raised_to_them() -> None:
    d = _released(1, 5).to_dict()
    d["published"] = 2
    assert ServingState.from_dict(d).published == 5


@pytest.mark.parametrize("bad", [-1, "3", True, 1.5])
def test_published_must_be_a_non_negative_integer(bad: object) -> None:
    d = _released(1).to_dict()
    d["published"] = bad
    with pytest.raises(ValueError, match="published"):
        ServingState.from_dict(d)


# ---------------------------------------------------------------------------- protected versions


def test_protected_versions_follow_the_rollback_chain() -> None:
    s = _released(1, 2, 3, 4)
    assert (s.serving, s.previous) == (4, 3)
    assert s.protected_versions() == {1, 2, 3, 4}
    # what one rollback leaves reachable is still protected; the version it left is the previous
    once = s.rolled_back("t")
    assert once.protected_versions() >= {once.serving, once.previous}


def test_protected_versions_include_the_candidate_and_stop_on_cycles() -> None:
    s = _released(1, 2).with_candidate(3, "fp3", "t")
    assert s.protected_versions() == {1, 2, 3}
    assert _released(1).protected_versions() == {1}
    assert ServingState.empty(NAME).protected_versions() == set()
    assert _released(1, 2).rolled_back("t").protected_versions() == {1}  # 2 -> 1, and 1 has no previous


def test_protected_versions_stop_on_a_rollback_cycle() -> None:
    # released 1, 2, then 1 again: 1 was served after 2 and 2 after 1, so rollbacks ping-pong
    cycle = _released(1, 2, 1)
    assert (cycle.serving, cycle.previous) == (1, 2)
    assert cycle.protected_versions() == {1, 2}


# ---------------------------------------------------------------------------- a repository on disk, no Triton


def _publish(root: Path, model_name: str, versions: list[int], *, served: int, live: list[int]) -> None:
    """Version directories with release.json (and live configs) as publish + reconcile leave them."""
    names = ModelName(model_name).names

    def policy(vs: list[int]) -> str:
        return f"version_policy: {{ specific: {{ versions: [ {', '.join(map(str, vs))} ] }} }}"

    for model in names.models:
        (root / model).mkdir(parents=True, exist_ok=True)
        vs = [served] if model == names.ensemble else live
        (root / model / "config.pbtxt").write_text(f'name: "{model}"\nmax_batch_size: 64\n{policy(vs)}\n')
        for v in versions:
            vdir, workspace = root / model / str(v), root.parent / "releases" / model_name / f"fp{v}"
            vdir.mkdir(exist_ok=True)
            (vdir / "weights.bin").write_bytes(f"{model}-{v}".encode())
            (workspace / model).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(vdir / "weights.bin", workspace / model / "weights.bin")  # what publish shipped from
            info = {"version": v, "model": model, "model_name": model_name, "fingerprint": f"fp{v}"}
            info |= {"workspace": str(workspace), "files": {"weights.bin": sha256_file(vdir / "weights.bin")}}
            (vdir / "release.json").write_text(json.dumps(info))


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """A repository with no Triton behind it (a closed port) and MLflow faked out."""
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.setenv("SEQCLS_TRITON_REPOSITORY", str(repo))
    monkeypatch.setenv("SEQCLS_TRITON_GRPC", "127.0.0.1:9")

    def no_mlflow(*args, **kwargs):
        raise ConnectionError("MLflow is not part of this test")

    monkeypatch.setattr("seqcls.ops.status.client", no_mlflow)
    monkeypatch.setattr("seqcls.ops.sync.mirror_champion", no_mlflow)
    return Settings.from_env()


def _repo(settings: Settings) -> Path:
    return Path(str(settings.triton_repository))


def _two_models(settings: Settings, garbage: bytes) -> Path:
    """``seqcls`` healthy (released 1); ``alpha``'s state file holds ``garbage`` and has no copy."""
    root = _repo(settings)
    write_state(root, _released(1), expected_generation=0)
    _publish(root, NAME, [1], served=1, live=[1])
    _publish(root, ModelName("alpha"), [1], served=1, live=[1])
    state_path(root, ModelName("alpha")).write_bytes(garbage)
    return state_path(root, ModelName("alpha"))


# ---------------------------------------------------------------------------- scenario 5: a garbage state file


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_a_garbage_state_file_is_a_clear_error_naming_it(tmp_path: Path, kind: str) -> None:
    path = state_path(tmp_path, ModelName("alpha"))
    path.write_bytes(GARBAGE[kind])
    with pytest.raises(ServingError) as info:
        read_state(tmp_path, ModelName("alpha"))
    assert str(path) in str(info.value) and "seqcls sync --model-name alpha" in str(info.value)
    with pytest.raises(ServingError):  # no writer writes over it blindly
        write_state(tmp_path, _released(2, name=ModelName("alpha")), expected_generation=0)
    assert path.read_bytes() == GARBAGE[kind]


def test_a_garbage_state_file_falls_back_to_its_backup_and_sync_records_it_again(tmp_path: Path) -> None:
    w1 = write_state(tmp_path, _released(1, name=ModelName("alpha")), expected_generation=0)
    write_state(tmp_path, w1.with_candidate(2, "fp2", "run-2"), expected_generation=1)
    path = state_path(tmp_path, ModelName("alpha"))
    path.write_bytes(GARBAGE["binary"])
    copy = current_state(tmp_path, ModelName("alpha"))  # the newest readable copy: the log's generation 2
    assert (copy.serving, copy.candidate, copy.generation) == (1, 2, 2)
    state_file.log_path(tmp_path, ModelName("alpha")).unlink()
    copy = current_state(tmp_path, ModelName("alpha"))  # without the log: the .bak, generation 1
    assert (copy.serving, copy.candidate, copy.generation) == (1, None, 1)
    restored = state_file.restore_state(tmp_path, ModelName("alpha"))
    assert restored is not None and read_state(tmp_path, ModelName("alpha")).serving == 1
    assert path.with_name(path.name + ".damaged").read_bytes() == GARBAGE["binary"]
    assert state_file.restore_state(tmp_path, ModelName("alpha")) is None  # not damaged any more


def test_status_reports_the_garbage_state_of_one_model_and_answers_for_the_others(settings: Settings) -> None:
    path = _two_models(settings, GARBAGE["binary"])
    reports = {r.model_name: r for r in status(settings)}
    assert set(reports) == {NAME, "alpha"}
    assert any(str(path) in p for p in reports["alpha"].problems), reports["alpha"].problems
    assert reports[NAME].recorded["serving"] == 1  # answered, not aborted
    assert main(["status"]) == 1


def test_sync_reports_the_garbage_state_of_one_model_and_converges_the_others(settings: Settings) -> None:
    path = _two_models(settings, GARBAGE["wrong schema"])
    results = {r.model_name: r for r in sync(settings)}
    assert set(results) == {NAME, "alpha"}
    assert str(path) in " ".join(results["alpha"].errors.values())
    assert results[NAME].serving == 1  # reached its reconcile (the endpoint is down in this test)
    assert main(["sync"]) == 1


# ---------------------------------------------------------------------------- scenario 10: a garbage lease file


def test_a_garbage_lease_is_a_clear_error_and_lease_break_removes_it(settings: Settings) -> None:
    root = _repo(settings)
    lease = ReleaseLease(root, ModelName("alpha"))
    lease.path.write_bytes(GARBAGE["binary"])
    with pytest.raises(LeaseError, match=r"unreadable.*seqcls lease break --model-name alpha"):
        lease.holder()
    write_state(root, _released(1, name=ModelName("alpha")), expected_generation=0)
    _publish(root, ModelName("alpha"), [1], served=1, live=[1])
    (report,) = status(settings, ["alpha"])
    assert any("seqcls lease break --model-name alpha" in p for p in report.problems), report.problems
    assert main(["lease", "break", "--model-name", "alpha"]) == 0
    assert not lease.path.exists() and lease.holder() is None


# ---------------------------------------------------------------------------- scenario 9: history pinning + log


def _failed_attempts(s: ServingState, version: int, n: int) -> ServingState:
    for _ in range(n):
        s = s.with_candidate(version, f"fp{version}", "scheduled").without_candidate("scheduled", "smoke failed")
    return s


def test_failed_attempts_never_push_the_served_fingerprint_out_of_the_history() -> None:
    s = _failed_attempts(_released(1, 2), 3, 25)
    assert len(s.history) == state_file.HISTORY_LIMIT
    assert s.fingerprint_of(2) == "fp2" and s.fingerprint_of(1) == "fp1"
    assert ServingState.from_dict(json.loads(json.dumps(s.to_dict()))).fingerprint_of(2) == "fp2"
    back = s.rolled_back("op")  # the release entries survive the noise: rollback finds its way back
    assert (back.serving, back.previous) == (1, None) and back.fingerprint_of(1) == "fp1"
    assert s.protected_versions() == {1, 2}


def test_every_recorded_change_is_appended_to_the_log(tmp_path: Path) -> None:
    s = write_state(tmp_path, _released(1, name=ModelName("alpha")), expected_generation=0)
    for _ in range(30):
        s = write_state(tmp_path, _failed_attempts(s, 2, 1), expected_generation=s.generation)
    lines = state_file.log_path(tmp_path, ModelName("alpha")).read_text().splitlines()
    assert len(lines) == 31 and json.loads(lines[-1])["generation"] == 31
    entries = [e for line in lines for e in json.loads(line)["entries"]]
    assert len(entries) == 2 + 30 * 2  # candidate + release, then candidate + abandon per attempt
    logged = state_file.read_log(tmp_path, ModelName("alpha"))
    assert logged is not None and logged.serving == 1 and logged.fingerprint_of(1) == "fp1"
    assert not tmp_path.joinpath(state_file.log_path(tmp_path, ModelName("alpha")).name).is_dir()  # a plain file
    assert models_in(tmp_path) == ["alpha"]  # the log is not a state file of a model "alpha.log"


# ---------------------------------------------------------------------------- scenario 4: a lost state file


def test_a_lost_state_of_a_non_default_model_is_reconstructed_from_its_configs(settings: Settings) -> None:
    root = _repo(settings)
    _publish(root, ModelName("alpha"), [1, 2], served=2, live=[1, 2])
    write_state(root, _released(1, 2, name=ModelName("alpha")), expected_generation=0)
    state_path(root, ModelName("alpha")).unlink()
    root.joinpath(".seqcls-state.alpha.log.jsonl").unlink(missing_ok=True)
    assert models_in(root) == ["alpha"]
    s = current_state(root, ModelName("alpha"))
    assert (s.serving, s.previous, s.generation) == (2, 1, 0) and s.fingerprint_of(2) == "fp2"
    (report,) = status(settings)
    assert any("is missing" in p and "seqcls sync --model-name alpha" in p for p in report.problems)


def test_a_lost_state_is_reconstructed_from_the_log_keeping_the_version_counter(settings: Settings) -> None:
    root = _repo(settings)
    _publish(root, ModelName("alpha"), [1, 2], served=2, live=[1, 2])
    write_state(root, _released(1, 2, name=ModelName("alpha")).allocated(5), expected_generation=0)
    state_path(root, ModelName("alpha")).unlink()
    s = current_state(root, ModelName("alpha"))
    assert (s.serving, s.previous, s.published, s.generation) == (2, 1, 5, 0)
    assert write_state(root, s, expected_generation=0).published == 5


def test_sync_changes_nothing_for_a_lost_state_nothing_reconstructs(settings: Settings) -> None:
    root = _repo(settings)
    _publish(root, ModelName("alpha"), [1], served=1, live=[1])
    for model in ModelName("alpha").names.models:
        (root / model / "config.pbtxt").unlink()
    assert models_in(root) == []  # nothing of it is served: not one of the repository's models
    (result,) = sync(settings, ["alpha"])
    assert result.model_name == "alpha" and not result.ok and not result.actions
    assert "nothing was changed" in result.errors["state"] and "seqcls release --checkpoint" in result.errors["state"]


def test_corrupt_state_advice_is_true_for_a_non_default_model(tmp_path: Path) -> None:
    path = state_path(tmp_path, ModelName("alpha"))
    path.write_bytes(GARBAGE["binary"])
    with pytest.raises(ServingError) as info:
        read_state(tmp_path, ModelName("alpha"))
    assert "reconstructs the state from what the repository's config.pbtxt files serve" in str(info.value)
    assert "adopts" not in str(info.value)


# ---------------------------------------------------------------------------- scenario 2: damaged versions


def test_status_and_sync_report_a_missing_previous_version_with_its_fix(settings: Settings) -> None:
    root = _repo(settings)
    _publish(root, ModelName("alpha"), [1, 2], served=2, live=[1, 2])
    write_state(root, _released(1, 2, name=ModelName("alpha")), expected_generation=0)
    shutil.rmtree(root / "alpha_model" / "1")
    (report,) = status(settings)
    problem = [p for p in report.problems if "previous version 1" in p]
    assert problem and "missing alpha_model/1" in problem[0] and "seqcls release --checkpoint" in problem[0]
    (result,) = sync(settings)
    assert any("previous version 1" in e for e in result.errors.values()), result.errors
    assert (root / "alpha_model" / "2").is_dir()  # nothing intact was cleaned away


def test_sync_restores_a_changed_file_of_the_served_version_from_its_workspace(settings: Settings) -> None:
    root = _repo(settings)
    _publish(root, ModelName("alpha"), [1, 2], served=2, live=[1, 2])
    write_state(root, _released(1, 2, name=ModelName("alpha")), expected_generation=0)
    weights = root / "alpha_model" / "2" / "weights.bin"
    weights.write_bytes(b"changed by hand")
    (root / "alpha_tokenizer" / "1" / "weights.bin").unlink()
    (report,) = status(settings)
    assert any("served version 2" in p and "changed since publish" in p for p in report.problems), report.problems
    assert any("previous version 1" in p and "alpha_tokenizer/1/weights.bin missing" in p for p in report.problems)
    (result,) = sync(settings)
    assert weights.read_bytes() == b"alpha_model-2"
    assert any(a.startswith("restored alpha_model/2/weights.bin") for a in result.actions), result.actions
    assert (root / "alpha_tokenizer" / "1" / "weights.bin").read_bytes() == b"alpha_tokenizer-1"
    assert not [p for p in status(settings)[0].problems if "version" in p and "damaged" in p]


def test_sync_does_not_restore_what_no_copy_matches(settings: Settings) -> None:
    root = _repo(settings)
    _publish(root, ModelName("alpha"), [1], served=1, live=[1])
    write_state(root, _released(1, name=ModelName("alpha")), expected_generation=0)
    shutil.rmtree(root.parent / "releases")  # the workspace is gone too
    (root / "alpha_model" / "1" / "weights.bin").write_bytes(b"changed by hand")
    (result,) = sync(settings)
    assert (root / "alpha_model" / "1" / "weights.bin").read_bytes() == b"changed by hand"
    problem = " ".join(result.errors.values())
    assert "served version 1" in problem and "seqcls release --checkpoint" in problem and "seqcls rollback" in problem


# ---------------------------------------------------------------------------- drills: real Triton + sqlite MLflow


def _no_traceback(out) -> None:
    assert "Traceback" not in out.stderr and "UnicodeDecodeError" not in out.stderr, out.stderr[-3000:]


def _restart_with_cli(d: Drill):
    """`seqcls triton start` on the drill's ports and repository (it syncs every model)."""
    d.server.stop()
    return d.cli("triton", "start")


def _back_to_the_drill_server(d: Drill) -> None:
    assert d.cli("triton", "stop").returncode == 0
    d.server.start()


MODULE = "test_state_integrity"


@pytest.fixture(scope="module", autouse=True)
def _drill_record() -> Iterator[None]:
    yield
    write_record(MODULE)


@drill_test
def test_drill_lost_state_of_a_non_default_model_keeps_it_served(drill: Drill, tiny_checkpoint_src: Path) -> None:
    """Scenario 4: alpha's state file deleted (as the corrupt-state message advised): sync unloaded it."""
    d = drill
    d.release(tiny_checkpoint_src)
    d.release(tiny_checkpoint_src, model_name="alpha")
    before = {m: served_answers(d, m) for m in (NAME, "alpha")}
    state_path(d.repo, ModelName("alpha")).unlink()
    out = d.cli("status")
    _no_traceback(out)
    assert out.returncode == 1 and "alpha" in out.stdout and "is missing" in out.stdout, out.stdout[-3000:]
    for args in (("sync", "--model-name", "alpha"), ("sync",)):
        out = d.cli(*args)
        _no_traceback(out)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        assert {m: served_answers(d, m) for m in (NAME, "alpha")} == before
    assert state_path(d.repo, ModelName("alpha")).is_file() and d.state(ModelName("alpha")).serving == 1
    d.assert_invariant(served=1)


@drill_test
def test_drill_garbage_state_of_one_model_leaves_the_others_served(drill: Drill, tiny_checkpoint_src: Path) -> None:
    """Scenario 5: binary garbage in alpha's state: `triton start`, `sync`, `status` aborted for every model."""
    d = drill
    d.release(tiny_checkpoint_src)
    d.release(tiny_checkpoint_src, model_name="alpha")
    before = {m: served_answers(d, m) for m in (NAME, "alpha")}
    path = state_path(d.repo, ModelName("alpha"))
    path.write_bytes(GARBAGE["binary"])
    # with a readable copy (.bak / log): a restart serves both models and records the copy again
    out = _restart_with_cli(d)
    try:
        _no_traceback(out)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        assert {m: served_answers(d, m) for m in (NAME, "alpha")} == before
        assert read_state(d.repo, ModelName("alpha")).serving == 1  # recorded again
    finally:
        _back_to_the_drill_server(d)
    assert all(r.ok for r in timed_sync(d.settings, "5: garbage state of one model", "others served", module=MODULE))
    # without any copy: alpha is reported (naming its file), the default model still converges
    path.write_bytes(GARBAGE["binary"])
    for copy in (path.with_name(path.name + ".bak"), d.repo / ".seqcls-state.alpha.log.jsonl"):
        copy.unlink(missing_ok=True)
    for command in ("status", "sync"):
        out = d.cli(command)
        _no_traceback(out)
        assert out.returncode == 1 and str(path) in out.stdout + out.stderr, out.stdout[-2000:] + out.stderr[-2000:]
    assert status(d.settings, [NAME])[0].agree and served_answers(d, NAME) == before[NAME]
    path.unlink()  # what the message advises when no copy is left: the configs say what alpha serves
    out = d.cli("sync")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert {m: served_answers(d, m) for m in (NAME, "alpha")} == before
    d.assert_invariant(served=1)


@drill_test
def test_drill_failed_attempts_keep_the_served_fingerprint(drill: Drill, tiny_checkpoint_src: Path) -> None:
    """Scenario 9: 25 failed attempts of one checkpoint pushed the served fingerprint out of the history."""
    d = drill
    d.release(tiny_checkpoint_src)
    before = served_answers(d, NAME)
    s = read_state(d.repo, NAME)
    for _ in range(25):  # what each failed attempt records: a candidate, then its abandon
        s = write_state(d.repo, _failed_attempts(s, 2, 1), expected_generation=s.generation)
    assert all(r.ok for r in timed_sync(d.settings, "9: 25 failed attempts", "fingerprint kept", module=MODULE))
    out = d.cli("status")
    assert out.returncode == 0, out.stdout[-3000:]
    assert served_answers(d, NAME) == before
    d.assert_invariant(served=1)


@drill_test
def test_drill_garbage_lease_is_reported_and_lease_break_fixes_it(drill: Drill, tiny_checkpoint_src: Path) -> None:
    """Scenario 10: binary garbage in a lease file: `status` and `seqcls lease break` both crashed."""
    d = drill
    d.release(tiny_checkpoint_src)
    before = served_answers(d, NAME)
    ReleaseLease(d.repo, NAME).path.write_bytes(GARBAGE["binary"])
    out = d.cli("status")
    _no_traceback(out)
    assert out.returncode == 1 and "seqcls lease break --model-name seqcls" in out.stdout, out.stdout[-3000:]
    out = d.cli("lease", "break", "--model-name", NAME)
    _no_traceback(out)
    assert out.returncode == 0, out.stderr[-3000:]
    assert served_answers(d, NAME) == before
    d.assert_invariant(served=1)


@drill_test
def test_drill_damaged_served_and_missing_previous_versions(drill: Drill, tiny_checkpoint_src: Path) -> None:
    """Scenario 2 (status/sync): the warm previous version's directory deleted: status said all agree."""
    d = drill
    d.release(tiny_checkpoint_src)
    d.release(tiny_checkpoint_src, threshold=0.4)  # version 2, no new export
    assert (d.state().serving, d.state().previous) == (2, 1)
    before = served_answers(d, NAME)
    served_onnx = d.repo / ModelName(NAME).names.model / "2" / "model.onnx"
    digest = sha256_file(served_onnx)
    served_onnx.write_bytes(b"damaged by hand")  # restorable: the workspace holds the bytes publish shipped
    shutil.rmtree(d.repo / ModelName(NAME).names.model / "1")  # not restorable: its release.json is gone too,
    (d.repo / ".seqcls-pins.seqcls.v1.json").unlink()  # and no pin records it (a version published before pins)
    fix = f"seqcls release --checkpoint {tiny_checkpoint_src}"
    out = d.cli("status")
    _no_traceback(out)
    assert out.returncode == 1 and "previous version 1" in out.stdout and fix in out.stdout, out.stdout[-3000:]
    assert "served version 2" in out.stdout and "model.onnx changed since publish" in out.stdout
    out = d.cli("sync", "--json")
    _no_traceback(out)
    (result,) = json.loads(out.stdout)
    assert out.returncode == 1 and any(a.startswith("restored seqcls_model/2/model.onnx") for a in result["actions"])
    assert "previous version 1" in json.dumps(result["errors"]) and fix in json.dumps(result["errors"])
    assert sha256_file(served_onnx) == digest
    assert served_answers(d, NAME) == before
    out = d.cli("release", "--checkpoint", str(tiny_checkpoint_src))  # the fix it names
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]  # what is served now, where, and where the time went
    assert last.startswith("seqcls: serving Triton v3 (MLflow v") and f" at {d.server.config.grpc_url} " in last
    assert "release took" in last and "steps" in last and "resolve + preflight" in last, last
    # removes what is left of version 1 (no rollback target)
    assert all(r.ok for r in timed_sync(d.settings, "2: served damaged, previous gone", "restored", module=MODULE))
    d.assert_invariant(served=3)
