"""Changing what is served: the release lease, then the recorded state, then reconcile.

Every change of a model's serving state follows the same three moves, in this order:

1. hold the model's release lease (:mod:`seqcls.serving.lease`) — one release at a time;
2. check the new :class:`~seqcls.serving.state.ServingState` can be applied — every version it loads
   is complete on disk and matches the hashes in its ``release.json`` (:func:`checked`) — then write
   it atomically, *before* any endpoint is touched, so a crash at any later point leaves the truth
   on disk and the truth is always something the repository can serve;
3. :func:`~seqcls.serving.reconcile.reconcile` every endpoint to it (under the repository lock).

Who holds the lease: a release is identified by model + fingerprint + serving configuration
(``release:<model>:<fp16>:<key8>``), so the steps of one release re-enter it whether they run in
one CLI process or as separate Airflow tasks (kind ``run``: no pid to watch, expires by ttl unless
renewed by the next task); a CLI process holds it as kind ``process`` (recovered as soon as that
pid is gone).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import socket
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from seqcls import faults
from seqcls.contract.names import ModelName
from seqcls.errors import ServingError
from seqcls.release.keys import release_key
from seqcls.release.workspace import Release
from seqcls.serving.client import Endpoint, TritonOps, ops_for
from seqcls.serving.lease import LeaseHolder, ReleaseLease
from seqcls.serving.reconcile import ReconcileReport, observe, reconcile
from seqcls.serving.repository import Repository
from seqcls.serving.state import ServingState, current_state, write_state

log = logging.getLogger(__name__)

DEFAULT_LEASE_TIMEOUT = 1800.0  # a second release waits this long for the first, then fails naming it


@dataclass(frozen=True)
class LeaseContext:
    """How this process takes leases: ``kind`` process (CLI) or run (Airflow task of run ``run``)."""

    kind: str = "process"
    run: str | None = None
    timeout: float = DEFAULT_LEASE_TIMEOUT


_CONTEXT: contextvars.ContextVar[LeaseContext | None] = contextvars.ContextVar("seqcls_lease", default=None)


def current_context() -> LeaseContext:
    return _CONTEXT.get() or LeaseContext()


@contextlib.contextmanager
def lease_context(ctx: LeaseContext) -> Iterator[None]:
    token = _CONTEXT.set(ctx)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def is_release_owner(owner: str, model_name: str) -> bool:
    """Whether lease owner ``owner`` is a release of ``model_name`` (see :func:`release_owner`)."""
    return owner.startswith(f"release:{model_name}:")


def release_owner(release: Release) -> str:
    """``release:<model>:<fingerprint16>:<release_key8>``: the same checkpoint released with other
    thresholds is another release (another owner, so the lease keeps the two apart)."""
    cfg, fp = release.config, release.checkpoint.fingerprint
    return f"release:{cfg.model_name}:{fp[:16]}:{release_key(release)[:8]}"


def take_lease(repository: Path, model_name: str, owner: str, step: str) -> LeaseHolder:
    """Acquire (or re-enter and renew) ``owner``'s lease on ``model_name``, per this process's context."""
    ctx = current_context()
    lease = ReleaseLease(repository, model_name)
    by = ctx.run or f"{socket.gethostname()}:{os.getpid()}"
    return lease.acquire(owner, kind=ctx.kind, run=by, step=step, timeout=ctx.timeout)  # type: ignore[arg-type]


def give_lease(repository: Path, model_name: str, owner: str) -> bool:
    return ReleaseLease(repository, model_name).release(owner)


def require_live(endpoints: Sequence[Endpoint]) -> None:
    """Every endpoint answers (else a ServingError saying how to start it) — checked before a change is
    recorded, so a release against a stopped Triton changes nothing at all."""
    for op in ops_for(endpoints):
        op.require_live()


def _fix(model_name: str, role: str, version: int, before: ServingState) -> str:
    sync = f"`seqcls sync --model-name {model_name}` restores a version from its release workspace where it can"
    if role == "serving" and before.serving == version:
        return (
            f"The served version must be intact before anything else changes: {sync}; otherwise serve the "
            f"previous version with `seqcls rollback --model-name {model_name}`, then release again."
        )
    if role == "serving":
        return f"It cannot be served again as it is: {sync}; or release the model you want instead."
    return "Publish the release again (`seqcls release` writes a new version; a published version is never edited)."


def checked(repo: Repository, before: ServingState, after: ServingState) -> ServingState:
    """``after``, if the repository can serve it; else a ServingError naming the version, what is wrong, the fix.

    The served version and the candidate must be complete and match their ``release.json`` hashes. A
    *previous* that is gone (pruned, deleted, damaged) never blocks an otherwise valid change: it is
    dropped from the new state with a warning — nothing could roll back to it anyway. A change that
    only withdraws the candidate (undoing a failed attempt) loads nothing new and is always allowed.
    """
    withdrawing = after.serving == before.serving and after.candidate is None
    for role, version in (("serving", after.serving), ("candidate", after.candidate)):
        # a served version that stays served is not loaded anew: a release may proceed beside a damaged one
        # that nothing can restore (publish said so); rolling back to a damaged version is refused
        unchanged = role == "serving" and version == before.serving and after.candidate is not None
        problems = [] if version is None or withdrawing or unchanged else repo.problems(version)
        if problems:
            raise ServingError(
                f"{after.model_name}: refusing to record version {version} as {role}: {'; '.join(problems[:5])}. "
                f"Nothing was changed (still serving {before.serving}). "
                + _fix(after.model_name, role, version, before)  # type: ignore[arg-type]
            )
    if after.previous is not None and (problems := repo.problems(after.previous)):
        log.warning(
            "%s: version %d cannot stay the previous version (%s); recording no previous version",
            after.model_name,
            after.previous,
            "; ".join(problems[:3]),
        )
        after = replace(after, previous=None)
    return after


def transition(
    repo: Repository,
    model_name: str,
    change,
    endpoints: Sequence[Endpoint],
    *,
    keep_previous: bool = True,
    live_first: bool = True,
) -> tuple[ServingState, ServingState, ReconcileReport]:
    """``change(state) -> state``: check it can be applied (:func:`checked`), write it (if different),
    then reconcile every endpoint. A refused change raises with nothing written or touched.

    Returns (before, after, report). The caller holds the lease; the repository lock serialises
    this against other reconciles (``seqcls sync``, another model's release on the same volume).
    ``live_first``: refuse before recording anything if an endpoint is down (releases); recovery
    paths (sync, rollback) pass False and converge what they can.
    """
    repo = repo.for_model(model_name)  # the model's own Triton names and lock, whatever view was passed
    if live_first:
        require_live(endpoints)
    with repo.lock(what=f"{model_name} state change"):
        before = current_state(repo.root, model_name)
        after = change(before)
        if after is not before and after != before:
            after = checked(repo, before, after)
            after = write_state(repo.root, after, expected_generation=before.generation)
            log.info(
                "state %s: serving %s → %s, candidate %s → %s, previous %s → %s (generation %d)",
                model_name,
                before.serving,
                after.serving,
                before.candidate,
                after.candidate,
                before.previous,
                after.previous,
                after.generation,
            )
        faults.point("state:written")
        report = reconcile(repo, after, ops_for(endpoints), keep_previous=keep_previous)
    return before, after, report


def require_converged(report: ReconcileReport, what: str) -> None:
    """A reconcile that left an endpoint behind is an error naming it (``seqcls sync`` finishes it)."""
    if report.errors:
        detail = "; ".join(f"{ep}: {textwrap.shorten(msg, 300, placeholder=' …')}" for ep, msg in report.errors.items())
        raise ServingError(
            f"{what}: the recorded state is written, but not every endpoint serves it — {detail}. Fix the "
            "endpoint and run `seqcls sync` (or let the seqcls_sync DAG do it); nothing else needs undoing."
        )


def reconcile_recorded(
    repo: Repository, model_name: str, endpoints: Sequence[Endpoint], *, keep_previous: bool = True
) -> tuple[ServingState, ReconcileReport]:
    """Reconcile to the recorded state without changing it (what ``sync`` does first)."""
    _, state, report = transition(
        repo, model_name, lambda s: s, endpoints, keep_previous=keep_previous, live_first=False
    )
    return state, report


def observe_all(endpoints: Sequence[Endpoint], model_name: ModelName) -> dict[str, dict[str, list[int]] | str]:
    """Endpoint → Triton model of ``model_name`` → READY versions (or the reason it could not be asked)."""
    names = model_name.names
    out: dict[str, dict[str, list[int]] | str] = {}
    for op in [TritonOps(e) for e in endpoints]:
        try:
            op.require_live()
            out[op.endpoint.grpc] = observe(op, names)
        except Exception as exc:
            out[op.endpoint.grpc] = f"unreachable: {textwrap.shorten(str(exc), 200, placeholder=' …')}"
    return out
