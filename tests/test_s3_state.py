"""The release lease and the recorded serving state on an object store (seqcls.serving.s3lease, s3state).

Through a real S3 server (SeaweedFS's ``weed server`` on loopback, :mod:`tests.helpers.seaweedfs`), with
racing writers as separate spawned processes (each its own client), a holder killed with SIGKILL, and a
store that is not there. Every assertion is on outcomes — who holds, what is recorded, which numbers exist —
never on how long something took; the short ttls (2 s) only make expiry happen within the test.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import uuid
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from seqcls.contract.names import ModelName
from seqcls.errors import LeaseError, ServingError
from seqcls.serving.objectstore import ObjectConflict, ObjectStore, S3Location
from seqcls.serving.s3lease import LeaseLost, LeaseRecord, LeaseView, S3ReleaseLease, control_key
from seqcls.serving.s3repo import MANIFEST, Manifest, ManifestFile
from seqcls.serving.s3state import S3ServingState, StateConflict
from tests.helpers.seaweedfs import SeaweedFS, seaweedfs

__all__ = ["seaweedfs"]  # the fixture, imported for this module's tests

SPAWN = multiprocessing.get_context("spawn")


def _model() -> ModelName:
    return ModelName(f"m{uuid.uuid4().hex[:10]}")


def _store(server: SeaweedFS) -> ObjectStore:
    return server.store("repo")


def _mark_complete(store: ObjectStore, model: ModelName, version: int, only: int = 4) -> None:
    """Give ``version`` of (the first ``only`` of) ``model``'s four Triton models their completion marker."""
    for triton in model.names.models[:only]:
        files = {"config.pbtxt": ManifestFile("0" * 64, 1)}
        manifest = Manifest(triton, version, files, "2026-12-05T00:00:00+00:00")
        store.put_immutable(f"{triton}/{version}/{MANIFEST}", manifest.to_bytes())


def _closed_port_store(server: SeaweedFS) -> ObjectStore:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loc = S3Location.parse(
        f"s3://{server.bucket}/repo", endpoint=f"http://127.0.0.1:{port}", credentials=server.credentials
    )
    return ObjectStore(loc)


# --- spawned sides of the races (module level: a spawned process imports them) ------------------------------


def _race_acquire(server: SeaweedFS, model: str, barrier: Any, name: str) -> tuple[str, str]:
    lease = S3ReleaseLease(_store(server), ModelName(model))
    lease.view()  # connect before the start line
    barrier.wait()
    try:
        held = lease.acquire(name, timeout=0, ttl=300)
    except LeaseError as exc:
        return "refused", str(exc)
    return "won", held.record.token


def _hold_until_killed(server: SeaweedFS, model: str, ready: Any) -> None:
    held = S3ReleaseLease(_store(server), ModelName(model)).acquire("doomed", ttl=2)
    ready.put((os.getpid(), held.record.token))
    while True:  # never renews: SIGKILL ends it
        signal.pause()


def _wait_and_take(server: SeaweedFS, model: str, barrier: Any, name: str) -> tuple[str, str]:
    lease = S3ReleaseLease(_store(server), ModelName(model))
    lease.view()
    barrier.wait()
    try:
        held = lease.acquire(name, timeout=10, ttl=300, poll=0.2)
    except LeaseError as exc:
        return "refused", str(exc)
    return "won", f"{held.record.token} {held.took_over_from}"


def _allocate_next(server: SeaweedFS, model: str, times: int) -> list[int]:
    state = S3ServingState(_store(server), ModelName(model))
    return [state.update(lambda s: s.allocated(s.published + 1), attempts=50).attempts for _ in range(times)]


def _append_events(server: SeaweedFS, model: str, barrier: Any, name: str, times: int) -> list[int]:
    state = S3ServingState(_store(server), ModelName(model))
    state.events()
    seqs = []
    for i in range(times):
        barrier.wait()
        seqs.append(state.append({"event": "note", "by": name, "i": i}).seq)
    return seqs


# --- no server ---------------------------------------------------------------------------------------------


def test_a_lease_s_age_is_read_on_the_store_s_clock_with_a_second_of_grain() -> None:
    record = LeaseRecord("a", "t" * 16, "h", 1, 2.0, "2026-12-05T00:00:00Z", "", 1)
    written = datetime(2026, 12, 5, tzinfo=UTC)
    assert not LeaseView(record, '"e"', written, written + timedelta(seconds=3)).expired  # 3 s: within ttl + grain
    assert LeaseView(record, '"e"', written, written + timedelta(seconds=4)).expired
    assert not LeaseView(None, None, None, written).expired and LeaseView(None, None, None, written).free
    released = LeaseView(LeaseRecord("a", "t", "h", 1, 2.0, "x", "", 2, released=True), '"e"', written, written)
    assert released.free and "released by a" in released.describe()


def test_control_objects_live_outside_every_triton_model_directory() -> None:
    model = ModelName("seqcls")  # its ensemble is also called seqcls: Triton downloads that directory whole
    assert control_key(model, "lease.json") == ".seqcls/seqcls/lease.json"
    assert all(not control_key(model, "x").startswith(f"{t}/") for t in model.names.all)


# --- the lease ---------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_a_lease_is_created_renewed_released_and_taken_again(seaweedfs: SeaweedFS) -> None:
    lease = S3ReleaseLease(_store(seaweedfs), _model())
    held = lease.acquire("run-1", step="publish", timeout=0)
    seen = lease.view()
    assert (seen.record.owner, seen.record.token, seen.etag) == ("run-1", held.record.token, held.etag)
    assert seen.record.host == socket.gethostname() and seen.record.pid == os.getpid()
    assert not seen.free and not seen.expired and seen.store_time is not None
    renewed = lease.renew(held, step="reload")
    assert renewed.etag != held.etag and lease.view().record.step == "reload"
    with pytest.raises(LeaseLost, match="run-1 lost the release lease"):
        lease.renew(held)  # the ETag of before the renewal: a stale proof
    assert lease.release(renewed) and lease.view().free
    again = lease.acquire("run-2", timeout=0)
    assert again.took_over_from is None and lease.view().record.owner == "run-2"


@pytest.mark.integration
def test_a_waiter_is_refused_after_its_timeout_naming_the_holder(seaweedfs: SeaweedFS) -> None:
    model = _model()
    held = S3ReleaseLease(_store(seaweedfs), model).acquire("release-A", step="smoke", ttl=300)
    with pytest.raises(LeaseError) as refused:
        S3ReleaseLease(_store(seaweedfs), model).acquire("release-B", timeout=0.5, poll=0.1)
    text = str(refused.value)
    assert not isinstance(refused.value, LeaseLost)
    for part in (repr(str(model)), "release-A", socket.gethostname(), f"pid {os.getpid()}", held.record.token[:8]):
        assert part in text, (part, text)
    assert "step smoke" in text and f".seqcls/{model}/lease.json" in text


@pytest.mark.integration
def test_two_processes_racing_to_acquire_exactly_one_holds(seaweedfs: SeaweedFS) -> None:
    models = [str(_model()) for _ in range(6)]
    with SPAWN.Manager() as manager, ProcessPoolExecutor(2, mp_context=SPAWN) as pool:
        for model in models:
            barrier = manager.Barrier(2)
            a = pool.submit(_race_acquire, seaweedfs, model, barrier, "A")
            b = pool.submit(_race_acquire, seaweedfs, model, barrier, "B")
            results = {"A": a.result(timeout=120), "B": b.result(timeout=120)}
            winners = [name for name, (outcome, _) in results.items() if outcome == "won"]
            assert len(winners) == 1, results
            view = S3ReleaseLease(_store(seaweedfs), ModelName(model)).view()
            assert (view.record.owner, view.record.token) == (winners[0], results[winners[0]][1])
            loser = "B" if winners[0] == "A" else "A"
            assert f"held by {winners[0]} on host" in results[loser][1]


@pytest.mark.integration
@pytest.mark.drill
def test_a_holder_killed_mid_lease_is_taken_over_after_its_ttl_by_exactly_one_of_two_waiters(
    seaweedfs: SeaweedFS,
) -> None:
    model = str(_model())
    with SPAWN.Manager() as manager:
        ready = manager.Queue()
        doomed = SPAWN.Process(target=_hold_until_killed, args=(seaweedfs, model, ready))
        doomed.start()
        pid, token = ready.get(timeout=120)
        os.kill(pid, signal.SIGKILL)
        doomed.join(timeout=30)
        assert doomed.exitcode == -signal.SIGKILL
        with ProcessPoolExecutor(2, mp_context=SPAWN) as pool:
            barrier = manager.Barrier(2)
            a = pool.submit(_wait_and_take, seaweedfs, model, barrier, "W1")
            b = pool.submit(_wait_and_take, seaweedfs, model, barrier, "W2")
            results = {"W1": a.result(timeout=120), "W2": b.result(timeout=120)}
    winners = [name for name, (outcome, _) in results.items() if outcome == "won"]
    assert len(winners) == 1, results
    assert f"doomed on host {socket.gethostname()}, pid {pid}, token {token[:8]}" in results[winners[0]][1]
    assert S3ReleaseLease(_store(seaweedfs), ModelName(model)).view().record.owner == winners[0]


@pytest.mark.integration
def test_a_holder_whose_expired_lease_was_taken_over_finds_out_at_its_next_renewal(seaweedfs: SeaweedFS) -> None:
    model = _model()
    first = S3ReleaseLease(_store(seaweedfs), model)
    slow = first.acquire("slow-release", ttl=2)  # and then never renews in time
    taker = S3ReleaseLease(_store(seaweedfs), model).acquire("next-release", timeout=30, poll=0.2, ttl=300)
    assert taker.took_over_from is not None and "slow-release" in taker.took_over_from
    with pytest.raises(LeaseLost, match=r"slow-release lost .* it is now held by next-release"):
        first.renew(slow)
    assert not first.release(slow), "a lost holder released someone else's lease"
    assert first.view().record.token == taker.record.token


@pytest.mark.integration
def test_an_operator_breaks_a_held_lease_and_its_holder_stops_at_its_next_renewal(seaweedfs: SeaweedFS) -> None:
    model = _model()
    lease = S3ReleaseLease(_store(seaweedfs), model)
    assert lease.break_lease("cli:ops", "nothing held") is None  # free: nothing to break, nothing written
    stuck = lease.acquire("stuck-release", ttl=900)
    broken = lease.break_lease("cli:ops", "its worker is gone")
    assert broken is not None and broken.record.owner == "stuck-release", broken
    seen = lease.view()
    assert seen.free and (seen.record.owner, seen.record.step) == ("cli:ops", "broken: its worker is gone")
    with pytest.raises(LeaseLost, match=r"stuck-release lost .*nobody \(released by cli:ops"):
        lease.renew(stuck)
    taken = S3ReleaseLease(_store(seaweedfs), model).acquire("next-release", timeout=0)  # at once, no ttl to wait
    assert taken.took_over_from is None and lease.view().record.owner == "next-release"
    assert not lease.release(stuck), "a broken holder released the next one's lease"


@pytest.mark.integration
def test_hold_keeps_the_lease_renewed_and_releases_it_at_the_end(seaweedfs: SeaweedFS) -> None:
    lease = S3ReleaseLease(_store(seaweedfs), _model())
    with lease.hold("cli-1", ttl=1.5) as keeper:
        first = keeper.check().record.generation
        for _ in range(300):  # until the heartbeat has renewed twice (bounded; not a timing assertion)
            if lease.view().record.generation >= first + 2:
                break
            keeper.stop.wait(0.1)
        seen = lease.view().record
        assert keeper.lost is None and seen.owner == "cli-1" and seen.generation >= first + 2
    assert lease.view().free and lease.view().record.owner == "cli-1"


# --- the state ---------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_two_writers_from_the_same_read_one_wins_the_other_conflicts_and_its_retry_loses_nothing(
    seaweedfs: SeaweedFS,
) -> None:
    model = _model()
    _mark_complete(_store(seaweedfs), model, 1)
    a, b = S3ServingState(_store(seaweedfs), model), S3ServingState(_store(seaweedfs), model)
    read_a, read_b = a.read(), b.read()
    assert read_a.etag is None and read_a == read_b
    won = a.write(read_a.state.promoted(1, "fp-one", "A"), read_a)
    with pytest.raises(StateConflict, match="changed since it was read"):
        b.write(read_b.state.allocated(2), read_b)
    assert a.read().etag == won.etag, "the losing write changed the state"
    retried = b.update(lambda s: s.allocated(2))
    final = a.read().state
    assert (final.serving, final.published, final.generation) == (1, 2, 2)
    assert final.fingerprint_of(1) == "fp-one" and retried.state == final
    events = [e.record for e in a.events().events if e.record["event"] == "state"]
    assert [e["generation"] for e in events] == [1, 2]
    assert events[0]["state"]["serving"] == 1 and events[0]["entries"][0]["by"] == "A"


@pytest.mark.integration
def test_processes_updating_one_state_by_cas_lose_no_update(seaweedfs: SeaweedFS) -> None:
    model = str(_model())
    with ProcessPoolExecutor(2, mp_context=SPAWN) as pool:
        runs = [pool.submit(_allocate_next, seaweedfs, model, 6) for _ in range(2)]
        attempts = [n for run in runs for n in run.result(timeout=300)]
    state = S3ServingState(_store(seaweedfs), ModelName(model))
    final = state.read().state
    assert (final.published, final.generation) == (12, 12), attempts
    gens = [e.record["generation"] for e in state.events().events if e.record["event"] == "state"]
    assert sorted(gens) == list(range(1, 13))


@pytest.mark.integration
def test_two_processes_racing_for_log_numbers_each_get_their_own_and_the_tail_reads_alone(
    seaweedfs: SeaweedFS,
) -> None:
    model = str(_model())
    with SPAWN.Manager() as manager, ProcessPoolExecutor(2, mp_context=SPAWN) as pool:
        barrier = manager.Barrier(2)
        runs = [pool.submit(_append_events, seaweedfs, model, barrier, name, 8) for name in ("A", "B")]
        seqs = {name: run.result(timeout=300) for name, run in zip("AB", runs, strict=True)}
    assert sorted(seqs["A"] + seqs["B"]) == list(range(1, 17)), seqs
    state = S3ServingState(_store(seaweedfs), ModelName(model))
    everything = state.events()
    assert [e.seq for e in everything.events] == list(range(1, 17)) and not everything.skipped
    for name in "AB":
        mine = [e for e in everything.events if e.record["by"] == name]
        assert [e.record["i"] for e in mine] == list(range(8)) and [e.seq for e in mine] == seqs[name]
    assert [e.seq for e in state.events(last=3).events] == [14, 15, 16]
    assert state.events(last=0).events == ()


@pytest.mark.integration
def test_a_damaged_event_is_skipped_and_named(seaweedfs: SeaweedFS) -> None:
    store = _store(seaweedfs)
    state = S3ServingState(store, _model())
    state.append({"event": "note"})
    key = state.append({"event": "note"}).seq
    damaged = f"{state.log_prefix}{key:012d}.json"
    store.delete(damaged)
    store.create(damaged, b'{"event": "forged"}')  # no sha256 metadata: not what append wrote
    read = state.events()
    assert [e.seq for e in read.events] == [1] and read.skipped == (damaged,)


@pytest.mark.integration
def test_a_state_naming_an_incomplete_version_is_refused_and_nothing_is_recorded(seaweedfs: SeaweedFS) -> None:
    model = _model()
    store = _store(seaweedfs)
    _mark_complete(store, model, 1)
    _mark_complete(store, model, 2, only=3)  # the ensemble's marker missing: a publish that died
    state = S3ServingState(store, model)
    state.update(lambda s: s.promoted(1, "fp1", "t"))
    before, events = state.read(), state.events().events
    with pytest.raises(ServingError) as refused:
        state.update(lambda s: s.with_candidate(2, "fp2", "t"))
    text = str(refused.value)
    assert f"model {str(model)!r}" in text and "version 2 as candidate" in text
    assert f"{model.names.ensemble}/2/{MANIFEST}" in text and "nothing was recorded" in text
    assert state.read() == before and state.events().events == events


@pytest.mark.integration
def test_the_store_down_gives_a_clear_error_naming_it_and_changes_nothing(seaweedfs: SeaweedFS) -> None:
    model = _model()
    live = S3ServingState(_store(seaweedfs), model)
    live.update(lambda s: s.allocated(1))
    before, events = live.read(), live.events().events
    down = _closed_port_store(seaweedfs)
    where = str(down.location)
    with pytest.raises(ServingError) as writing:
        S3ServingState(down, model).write(before.state.allocated(2), before)  # read while up, written while down
    with pytest.raises(ServingError) as reading:
        S3ServingState(down, model).read()
    with pytest.raises(ServingError) as leasing:
        S3ReleaseLease(down, model).acquire("x", timeout=0)
    for exc in (writing.value, reading.value, leasing.value):
        assert where in str(exc) and seaweedfs.credentials.secret_access_key not in str(exc), str(exc)
    assert live.read() == before and live.events().events == events
    assert json.loads(_store(seaweedfs).read(live.key)[0])["published"] == 1


class _LostResponses(ObjectStore):
    """A store whose conditional writes land but answer with a conflict, as a retried PUT meeting its own
    first attempt (whose response was lost) does."""

    def replace(self, key: str, data: bytes, etag: str) -> str:
        super().replace(key, data, etag)
        raise ObjectConflict(f"{key}: lost: PreconditionFailed (the retry of a write that landed)")


@pytest.mark.integration
def test_a_write_that_landed_but_answered_conflict_is_recognised_as_its_own(seaweedfs: SeaweedFS) -> None:
    model = _model()
    flaky = _LostResponses(seaweedfs.location("repo"))
    lease = S3ReleaseLease(flaky, model)
    held = lease.acquire("run-1", timeout=0)  # a create: not affected
    renewed = lease.renew(held, step="reload")
    assert renewed.etag == lease.view().etag and lease.view().record.step == "reload"
    state = S3ServingState(flaky, model)
    state.update(lambda s: s.allocated(1))  # created
    written = state.update(lambda s: s.allocated(2))  # replaced: landed, answered 412
    assert (written.attempts, state.read().state.published, state.read().etag) == (1, 2, written.etag)
    other = S3ServingState(_store(seaweedfs), model)
    stale = other.read()
    other.update(lambda s: s.allocated(3))
    with pytest.raises(StateConflict):  # a real conflict still is one
        state.write(stale.state.allocated(4), stale)


@pytest.mark.integration
def test_a_writer_far_behind_the_log_still_appends_at_its_end(seaweedfs: SeaweedFS) -> None:
    model = _model()
    behind, busy = S3ServingState(_store(seaweedfs), model), S3ServingState(_store(seaweedfs), model)
    assert behind.append({"event": "first"}).seq == 1
    assert [busy.append({"event": "busy"}).seq for _ in range(20)] == list(range(2, 22))
    assert behind.append({"event": "late"}).seq == 22  # its guess (2) taken: tries on, lists again
    assert [e.seq for e in behind.events().events] == list(range(1, 23))
