"""``seqcls replica-ready``'s decision with fakes: a fake replica, recorded states written as releases write them.

The same check through a real Triton (a replica that is not ready until reconciled) is
``tests/test_replica_ready_drill.py``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from seqcls.contract.names import ModelName
from seqcls.errors import InputError
from seqcls.ops.replica import (
    ModelReadiness,
    judge,
    replica_ready,
    replica_url,
    required_versions,
)
from seqcls.serving.repository import Repository
from seqcls.serving.state import ServingState, backup_path, log_path, state_path, write_state
from seqcls.settings import DEFAULT_GRPC, Settings

A, B = ModelName("alpha"), ModelName("beta")
FP = "a" * 64


class FakeReplica:
    """A replica holding ``loaded`` (Triton model → READY versions); ``answers``: the public route answers."""

    def __init__(self, loaded: dict[str, list[int]], *, live: bool = True, answers: bool = True, delay: float = 0.0):
        self.loaded, self.is_live, self.answers, self.delay = loaded, live, answers, delay
        self.inferred: list[tuple[str, int | None]] = []

    def live(self) -> bool:
        return self.is_live

    def ready(self, model: str, version: int | None = None) -> bool:
        time.sleep(self.delay)
        return version in self.loaded.get(model, [])

    def infer(self, texts: Sequence[str], *, model: str, version: int | None = None) -> Any:
        if not self.answers:
            raise RuntimeError(f"{model}: the python stub is not running")
        self.inferred.append((model, version))
        return [[]], None

    def index_states(self, model: str | None = None) -> dict[str, Any]:
        return {"error": "no control key"}


def _served(repo: Path, model: ModelName, version: int) -> ServingState:
    """``model`` serving ``version``, recorded as a release records it (candidate, then promoted)."""
    s = write_state(repo, ServingState.empty(model).with_candidate(version, FP, "release:t"), expected_generation=0)
    return write_state(repo, s.promoted(version, FP, "release:t"), expected_generation=s.generation)


def _everything(model: ModelName, version: int) -> dict[str, list[int]]:
    names = model.names
    return {m: [version] for m in (*names.composing, names.ensemble)}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    (tmp_path / "repo").mkdir()
    return Settings.from_env(home=tmp_path / "home", triton_repository=tmp_path / "repo")


def _root(settings: Settings) -> Path:
    return Path(str(settings.triton_repository))


def test_url_flag_then_the_one_configured_endpoint_then_the_local_triton(tmp_path: Path) -> None:
    one = Settings.from_env(home=tmp_path, triton_grpc=("localhost:8001",))
    assert replica_url("10.0.0.7:8001", one) == "10.0.0.7:8001"
    assert replica_url(None, one) == "localhost:8001"
    assert replica_url(None, Settings.from_env(home=tmp_path)) == DEFAULT_GRPC
    fleet = Settings.from_env(home=tmp_path, triton_grpc=("dns:///seqcls-triton:8001",))
    with pytest.raises(InputError, match="--url"):
        replica_url(None, fleet)  # a name for every replica is not one replica


def test_required_is_the_served_version_of_the_ensemble_and_its_composing_models(settings: Settings) -> None:
    _served(_root(settings), A, 3)
    serving, required = required_versions(Repository.from_settings(settings, A), A)
    assert serving == 3
    assert required == dict.fromkeys((*A.names.composing, A.names.ensemble), 3)  # no candidate route, no previous


def test_judge_ready_only_when_every_required_version_is_ready_and_answers() -> None:
    need = dict.fromkeys((*A.names.composing, A.names.ensemble), 2)
    replica = FakeReplica(_everything(A, 2))
    assert judge(A, 2, need, replica).ready
    assert replica.inferred == [(A.names.ensemble, 2)]  # pinned to the recorded version
    stale = judge(A, 2, need, FakeReplica(_everything(A, 1)))
    assert not stale.ready
    assert f"{A.names.ensemble} v2 not READY" in stale.line() and "--reconcile" in stale.line()
    mute = judge(A, 2, need, FakeReplica(_everything(A, 2), answers=False))
    assert not mute.ready and "did not answer" in mute.line()
    assert judge(A, None, {}, FakeReplica({})).ready  # nothing served: nothing to wait for


def test_not_live_is_not_ready(settings: Settings) -> None:
    _served(_root(settings), A, 1)
    result = replica_ready(settings, "x:1", ops=FakeReplica(_everything(A, 1), live=False))
    assert not result.ready and "not live" in (result.error or "")


def test_every_model_must_serve_its_recorded_version(settings: Settings) -> None:
    _served(_root(settings), A, 1)
    _served(_root(settings), B, 4)
    both = FakeReplica({**_everything(A, 1), **_everything(B, 4)})
    assert replica_ready(settings, "x:1", ops=both).ready
    only_a = replica_ready(settings, "x:1", ops=FakeReplica(_everything(A, 1)))
    assert not only_a.ready
    assert [m.ready for m in only_a.models] == [True, False]
    assert any(line.startswith(f"  {B}: NOT ready") for line in only_a.lines())


def test_one_models_broken_state_file_does_not_stop_the_check_of_another(settings: Settings) -> None:
    root = _root(settings)
    _served(root, A, 1)
    _served(root, B, 2)
    state_path(root, A).write_text("{ not json", encoding="utf-8")
    for copy in (backup_path(state_path(root, A)), log_path(root, A)):
        copy.unlink(missing_ok=True)  # no readable copy left: the state cannot be known
    result = replica_ready(settings, "x:1", ops=FakeReplica({**_everything(A, 1), **_everything(B, 2)}))
    by_name = {m.model_name: m for m in result.models}
    assert not result.ready
    assert not by_name[A].ready and "seqcls status --model-name alpha" in by_name[A].line()
    assert by_name[B].ready  # checked all the same


def test_reconcile_runs_first_per_model_and_never_writes_the_recorded_state(settings: Settings) -> None:
    root = _root(settings)
    _served(root, A, 1)
    before = state_path(root, A).read_bytes()
    replica = FakeReplica({})
    calls: list[str] = []

    def reconcile(repo: Repository, model: ModelName, endpoint) -> dict[str, str]:
        calls.append(model)
        replica.loaded.update(_everything(model, 1))
        return {}

    assert not replica_ready(settings, "x:1", ops=replica).ready  # the check alone changes nothing
    assert replica_ready(settings, "x:1", ops=replica, reconcile=True, reconciler=reconcile).ready
    assert calls == [A]
    assert state_path(root, A).read_bytes() == before


def test_a_reconcile_error_is_in_the_models_line(settings: Settings) -> None:
    _served(_root(settings), A, 1)

    def failing(repo: Repository, model: ModelName, endpoint) -> dict[str, str]:
        return {"x:1": f"load {model.names.model!r}: model.onnx is not a valid ONNX file"}

    result = replica_ready(settings, "x:1", ops=FakeReplica({}), reconcile=True, reconciler=failing)
    (model,) = result.models
    assert not model.ready and "model.onnx is not a valid ONNX file" in model.line()


def test_the_whole_check_is_bounded_by_the_timeout(settings: Settings) -> None:
    _served(_root(settings), A, 1)
    t0 = time.perf_counter()
    result = replica_ready(settings, "x:1", ops=FakeReplica(_everything(A, 1), delay=5.0), timeout=0.5)
    assert time.perf_counter() - t0 < 2.0
    assert not result.ready and "not answered within 0.5s" in (result.error or "")


def test_a_ready_line_names_the_served_version() -> None:
    assert ModelReadiness("alpha", 3, True).line() == "alpha: ready (serves recorded v3)"
