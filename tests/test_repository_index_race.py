"""One model's writes in the shared repository root never fail another model's look at Triton.

Every seqcls model keeps its state, lease and pins beside the Triton models, in the repository root,
and replaces them through temp files renamed into place (a lease is renewed every few seconds). Triton's
repository index lists the root and then stats each entry, so an entry renamed away in between makes
the whole index fail (``INTERNAL: failed to stat file ...``). A fresh-clone CI run lost a release that
way: alpha's expose step read the index while beta renewed its lease.

These drills run a real Triton and churn the root exactly as another model's writers do, while every
reader of the index (reconcile's ``observe``, ``require_live``, ``index_states``, preflight) is called
over and over (at least 2,000 reads during at least 600 writes): none may fail.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from seqcls.contract.names import ModelName
from seqcls.files import atomic_write
from seqcls.localtriton import LocalTriton
from seqcls.serving.client import Endpoint, TritonOps
from seqcls.serving.reconcile import observe
from seqcls.steps.preflight import triton_replica

READS = 2000
WRITES = 600


class _Churn:
    """Another model's writers in the root: its state replaced by rename, its staging directory renamed
    into place, as fast as they go, until stopped."""

    def __init__(self, root: Path) -> None:
        self.root, self.writes, self.error = root, 0, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)

    def _run(self) -> None:
        try:
            n = 0
            while not self._stop.is_set():
                n += 1
                atomic_write(self.root / ".seqcls-state.beta.json", f'{{"n": {n}}}')
                staged = self.root / f".tmp-publish.beta.{os.getpid()}-{n}"
                staged.mkdir()
                staged.rename(self.root / ".seqcls-churn-landed")
                os.rmdir(self.root / ".seqcls-churn-landed")
                self.writes += 1
        except BaseException as exc:  # reported by the test, never swallowed
            self.error = exc

    def __enter__(self) -> _Churn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@pytest.fixture
def ops(server: LocalTriton) -> Iterator[TritonOps]:
    op = TritonOps(Endpoint(server.grpc_url, control_key=server.control_key), request_timeout=10)
    yield op
    op.client.close()


def _hammer(read: Callable[[], object], root: Path) -> tuple[int, list[str]]:
    """``read`` at least :data:`READS` times and until the churn has made :data:`WRITES` writes (on a busy
    host an fsync can take longer than many reads): a drill that raced nothing proves nothing."""
    failures: list[str] = []
    reads, deadline = 0, time.monotonic() + 120
    with _Churn(root) as churn:
        while (reads < READS or churn.writes < WRITES) and time.monotonic() < deadline and churn.error is None:
            reads += 1
            try:
                read()
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
    assert churn.error is None, churn.error
    assert churn.writes >= WRITES, f"the churn made only {churn.writes} writes in 120 s: the drill raced nothing"
    return reads, failures


@pytest.mark.integration
def test_reconcile_observes_while_another_model_writes_in_the_root(server: LocalTriton, ops: TritonOps) -> None:
    names = ModelName("alpha").names
    reads, failures = _hammer(lambda: observe(ops, names), server.config.repository)
    assert not failures, f"{len(failures)} of {reads} index reads failed: {failures[:3]}"


@pytest.mark.integration
def test_require_live_index_states_and_preflight_while_another_model_writes(
    server: LocalTriton, ops: TritonOps
) -> None:
    endpoint = Endpoint(server.grpc_url, control_key=server.control_key)

    def read() -> None:
        ops.require_live()
        states = ops.index_states()
        assert "error" not in states, states["error"]
        ok, line = triton_replica(endpoint, timeout=10)
        assert ok, line

    reads, failures = _hammer(read, server.config.repository)
    assert not failures, f"{len(failures)} of {reads} rounds failed: {failures[:3]}"


class _RacedClient:
    """A client whose index fails ``fails`` times with ``error`` before answering."""

    def __init__(self, fails: int, error: Exception) -> None:
        self.fails, self.error, self.calls = fails, error, 0

    def get_model_repository_index(self, as_json: bool, client_timeout: float) -> dict:
        self.calls += 1
        if self.calls <= self.fails:
            raise self.error
        return {"models": [{"name": "alpha", "version": "1", "state": "READY"}]}


def _internal(message: str) -> Exception:
    from tritonclient.utils import InferenceServerException

    return InferenceServerException(message, status="StatusCode.INTERNAL")


def test_a_listing_race_is_read_again_and_anything_else_is_raised_at_once() -> None:
    from seqcls.serving.client import LISTING_ATTEMPTS

    raced = _internal("failed to stat file /repo/.seqcls-state.beta.json.1.x.tmp")
    client = _RacedClient(LISTING_ATTEMPTS - 1, raced)
    assert TritonOps.wrap(client).repository_index() == [{"name": "alpha", "version": "1", "state": "READY"}]
    assert client.calls == LISTING_ATTEMPTS

    client = _RacedClient(LISTING_ATTEMPTS, raced)  # a race that never ends is the caller's error, named
    with pytest.raises(type(raced), match="failed to stat file"):
        TritonOps.wrap(client).repository_index()
    assert client.calls == LISTING_ATTEMPTS

    client = _RacedClient(1, _internal("failed to load all models"))  # not the listing race: no second read
    with pytest.raises(type(raced), match="failed to load all models"):
        TritonOps.wrap(client).repository_index()
    assert client.calls == 1
