"""Registry clients racing through one MLflow server: the worker processes of ``test_team_registry_race.py``.

Why processes and not threads: each worker is its own interpreter with its own ``MlflowClient``, its own
``mlflow`` globals and its own pid, as two releases on two Airflow workers are — the server and
PostgreSQL see two clients, the journal and the lease see two processes. A worker runs the tail of a
release the way ``run_release`` does, through the product's functions: the run and its logged model (what
validate and register log), the release lease from register on, ``undo_dead_attempts`` and
:func:`seqcls.steps.register.create_version` (registered model, version, ``candidate``, each journalled),
the attempt ended once served, :func:`seqcls.registry.ledger.set_champion` (promote), the lease given back.
Only the artifacts (the pyfunc, ~seconds each) are left out.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: A barrier's wait: long enough for a loaded 2-core machine, short enough to fail a stuck round.
BARRIER_SECONDS = 120.0


def release_key(fingerprint: str) -> str:
    return hashlib.sha256(f"config:{fingerprint}".encode()).hexdigest()


def owner_of(model: str, fingerprint: str) -> str:
    """As :func:`seqcls.release.control.release_owner` names a release."""
    return f"release:{model}:{fingerprint[:16]}:{release_key(fingerprint)[:8]}"


def release_tail(settings, barriers: list, job: dict[str, Any]) -> dict[str, Any]:
    """One release's registry part (see the module doc); returns what it did and what it journalled.

    ``job``: ``model``, ``fingerprint``, ``triton_version``, ``lease_timeout`` and ``hold`` (wait at the
    second barrier once the lease is taken or refused: both have tried before either goes on).
    """
    from seqcls.contract.names import ModelName
    from seqcls.errors import LeaseError
    from seqcls.registry import journal
    from seqcls.registry.ledger import RELEASE_KEY_TAG, client, experiment, set_champion
    from seqcls.serving.lease import ReleaseLease
    from seqcls.steps.register import create_version

    model, fp = ModelName(job["model"]), job["fingerprint"]
    key, owner = release_key(fp), owner_of(model, fp)
    c = client(settings)
    barriers[0].wait(BARRIER_SECONDS)  # both clients at the same moment
    t0 = time.perf_counter()
    exp = experiment(c, settings, model)  # validate opens the run before the lease, as here
    run_id = c.create_run(exp, tags={"fingerprint": fp, RELEASE_KEY_TAG: key}).info.run_id
    logged = c.create_logged_model(exp, name="model", source_run_id=run_id)
    lease = ReleaseLease(Path(str(settings.triton_repository)), model)
    attempt = journal.Attempt.new(model, owner, fingerprint=fp)
    with journal.attempt_scope(attempt):
        try:
            lease.acquire(owner, kind="process", step="register", timeout=job["lease_timeout"], poll=0.05)
        except LeaseError as exc:
            if job.get("hold"):
                barriers[1].wait(BARRIER_SECONDS)
            undone = journal.undo_attempt(settings, model, attempt.id, reason="the lease was refused")
            return {"refused": str(exc), "run_id": run_id, "attempt": attempt.id, "undone": undone}
        entered = time.time()
        try:
            if job.get("hold"):
                barriers[1].wait(BARRIER_SECONDS)
            dead = journal.undo_dead_attempts(settings, model)
            version, created_rm, previous_candidate = create_version(
                c, settings, model, run_id=run_id, source=f"models:/{logged.model_id}", model_id=logged.model_id,
                tags={RELEASE_KEY_TAG: key, "fingerprint": fp}, description=f"race {fp[:8]}",
            )  # fmt: skip
            entries = [e for e in journal.read(journal.journal_path(settings, model)) if e["attempt"] == attempt.id]
            journal.end(settings, model, attempt.id, "completed")  # served: what expose does
            moved = set_champion(settings, model, version, job["triton_version"])  # promote
            left = time.time()
            seconds = round(time.perf_counter() - t0, 3)
        finally:
            lease.release(owner)
    return {
        "version": version,
        "run_id": run_id,
        "release_key": key,
        "created_registered_model": created_rm,
        "previous_candidate": previous_candidate,
        "previous_champion": moved["previous"],
        "journal": entries,
        "dead": dead,
        "held": (entered, left),
        "pid": os.getpid(),
        "seconds": seconds,
    }


def serve(conn, barriers: list, env: dict[str, str]) -> None:
    """A worker: one job per message (``{"home", "repository", ...job}``), its result or error sent back."""
    os.environ.update(env)
    from seqcls.settings import Settings

    while (job := conn.recv()) is not None:
        try:
            settings = Settings.from_env(home=Path(job["home"]), triton_repository=Path(job["repository"]))
            conn.send(release_tail(settings, barriers, job))
        except BaseException as exc:  # the test names it; a broken barrier frees the other worker
            for barrier in barriers:
                barrier.abort()
            conn.send({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})


@dataclass
class Racers:
    """Two worker processes and their barriers; :meth:`round` gives each a job at once."""

    procs: list
    conns: list
    barriers: list

    def round(self, jobs: list[dict[str, Any]], timeout: float = 300.0) -> list[dict[str, Any]]:
        for barrier in self.barriers:
            barrier.reset()
        for conn, job in zip(self.conns, jobs, strict=True):
            conn.send(job)
        results = []
        for conn in self.conns:
            if not conn.poll(timeout):
                raise TimeoutError(f"a racer did not answer in {timeout:.0f}s")
            results.append(conn.recv())
        return results


@contextmanager
def racers(env: dict[str, str], n: int = 2) -> Iterator[Racers]:
    """``n`` spawned interpreters (not forks: nothing of this process's MLflow state is shared)."""
    ctx = mp.get_context("spawn")
    barriers = [ctx.Barrier(n), ctx.Barrier(n)]
    pairs = [ctx.Pipe() for _ in range(n)]
    procs = [ctx.Process(target=serve, args=(child, barriers, env), daemon=True) for _, child in pairs]
    for proc in procs:
        proc.start()
    try:
        yield Racers(procs, [parent for parent, _ in pairs], barriers)
    finally:
        for conn in (parent for parent, _ in pairs):
            conn.send(None)
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


def open_store(barrier, queue, env: dict[str, str], home: str, uri: str) -> None:
    """One release's first MLflow call on a store nobody opened yet (``client()`` sets the store up)."""
    os.environ.update(env)
    from seqcls.registry.ledger import client
    from seqcls.settings import Settings

    settings = Settings.from_env(home=Path(home), mlflow_tracking_uri=uri)
    try:
        barrier.wait(BARRIER_SECONDS)
        client(settings).search_registered_models(max_results=1)
        queue.put("ok")
    except BaseException as exc:
        queue.put(f"{type(exc).__name__}: {str(exc)[:2000]}")


def open_store_at_once(env: dict[str, str], home: str, uri: str, n: int = 2) -> list[str]:
    """``n`` processes making their first call on ``uri`` at the same moment; what each said."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=open_store, args=(barrier, queue, env, home, uri)) for _ in range(n)]
    for proc in procs:
        proc.start()
    try:
        return [queue.get(timeout=600) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=60)
