"""One release at a time per model on an ``s3://`` repository: a lease made of conditional writes.

Why not the POSIX lease (:mod:`seqcls.serving.lease`): it guards its record with ``flock`` and an atomic
rename, neither of which an object store has. What a store does offer, and :func:`~seqcls.serving.objectstore.probe`
checks it honours, is the conditional PUT; the lease is built from that alone:

- acquire = ``create`` (``If-None-Match: *``) of :func:`control_key` ``(model, "lease.json")``, or, over a
  released or expired record, ``replace`` (``If-Match``) on the ETag just read: of two contenders exactly one
  write succeeds, the other re-reads, sees the winner and waits;
- renew (heartbeat) = ``replace`` on the ETag the holder got from its last write; a conflict means someone
  took the lease over, so the holder has lost it and must stop (:class:`LeaseLost`) — never two releases;
- release = ``replace`` with a *released* record. SeaweedFS 4.48 also honours ``If-Match`` on DELETE
  (measured: a stale ETag gets 412), but the probe does not check deletes on every store, so the lease never
  depends on it.

Age is measured on the store's clock: a record's ``Last-Modified`` (the time of its last write) against the
``Date`` of the response that read it, so hosts whose clocks disagree still agree on expiry. Both are whole
seconds, hence the extra :data:`CLOCK_GRAIN`. A holder that stopped renewing for longer than its ttl is
taken over. A waiter on another host cannot see the holder's processes, so that is the only rule across
hosts; on the holder's own host a single-process holder (kind ``process``: a CLI release) whose pid is gone
(a kill -9) is taken over at once, as the POSIX lease does — else a killed release would block its model,
and ``seqcls sync`` would leave its candidate, for the whole ttl.

The control objects live under ``.seqcls/<model>/``, not inside ``<model>/``: Triton's S3 file system
downloads a model's whole directory on every load, and the ensemble's directory bears the model's name.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime

from seqcls.contract.names import ModelName, require_name
from seqcls.errors import LeaseError
from seqcls.serving.objectstore import ObjectConflict, ObjectStore, Stamped
from seqcls.serving.pids import pid_alive, pid_start

log = logging.getLogger(__name__)

#: Every control object of the store (lease, state, log) is under ``<prefix>/.seqcls/<model>/``.
CONTROL = ".seqcls"
LEASE = "lease.json"
SCHEMA = 1
DEFAULT_TTL = 900.0
#: HTTP dates are whole seconds: an age read from two of them is off by up to one.
CLOCK_GRAIN = 1.0


def control_key(model: ModelName, name: str) -> str:
    """The key (relative to the repository's prefix) of control object ``name`` of ``model``."""
    return f"{CONTROL}/{require_name(model)}/{name}"


def _iso(moment: datetime | None) -> str:
    moment = moment or datetime.now(UTC)
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class LeaseLost(LeaseError):
    """The holder's lease was taken over (or not renewed within its ttl): stop the release now."""


@dataclass(frozen=True)
class LeaseRecord:
    """What ``lease.json`` holds. ``generation`` grows with every write, so no two writes share an ETag."""

    owner: str
    token: str
    host: str
    pid: int
    ttl_seconds: float
    acquired_at: str  # the store's clock (the Date of the read just before the acquiring write)
    step: str
    generation: int
    released: bool = False
    schema: int = SCHEMA
    #: ``run`` (an Airflow run, named by a waiter's error) or ``process`` (a CLI release: checked by pid on its host).
    kind: str = "process"
    run: str | None = None
    #: The holder's start time (:func:`~seqcls.serving.pids.pid_start`): a reused pid is not taken for it.
    pid_start: float | None = None

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> LeaseRecord:
        try:
            raw = json.loads(data.decode("utf-8"))
            return cls(
                owner=str(raw["owner"]),
                token=str(raw["token"]),
                host=str(raw["host"]),
                pid=int(raw["pid"]),
                ttl_seconds=float(raw["ttl_seconds"]),
                acquired_at=str(raw["acquired_at"]),
                step=str(raw.get("step", "")),
                generation=int(raw["generation"]),
                released=bool(raw.get("released", False)),
                schema=int(raw.get("schema", SCHEMA)),
                kind=str(raw.get("kind") or "process"),
                run=None if raw.get("run") is None else str(raw["run"]),
                pid_start=None if raw.get("pid_start") is None else float(raw["pid_start"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LeaseError(
                f"{where} is not a release lease record ({exc!r}). If no release of this model is running, "
                "delete that object; the next release creates a new one."
            ) from None


@dataclass(frozen=True)
class LeaseView:
    """The lease as one read saw it, with its age on the store's clock."""

    record: LeaseRecord | None
    etag: str | None
    modified: datetime | None
    store_time: datetime | None

    @property
    def age(self) -> float | None:
        """Seconds since the last write, store clock (the local clock if the store sent no Date)."""
        if self.modified is None:
            return None
        now = self.store_time or datetime.now(UTC)
        return (now - self.modified).total_seconds()

    @property
    def free(self) -> bool:
        return self.record is None or self.record.released

    @property
    def expired(self) -> bool:
        age = self.age
        return self.record is not None and age is not None and age > self.record.ttl_seconds + CLOCK_GRAIN

    @property
    def dead(self) -> str | None:
        """Why the holder no longer counts before its ttl (None while it may): a single-process holder on this
        host whose process is gone. Another host's processes cannot be seen: only the ttl tells there."""
        r = self.record
        if r is None or r.released or r.kind != "process" or r.host != socket.gethostname() or r.pid == os.getpid():
            return None
        return None if pid_alive(r.pid, r.pid_start) else f"its process {r.pid} on this host ({r.host}) is gone"

    def describe(self) -> str:
        r = self.record
        if r is None:
            return "nobody (no lease record)"
        if r.released:
            return f"nobody (released by {r.owner} at {_iso(self.modified)})"
        run = f"Airflow run {r.run}, " if r.kind == "run" and r.run else ""  # where to look for the holder
        return (
            f"{r.owner} on host {r.host}, pid {r.pid}, token {r.token[:8]}, {run}step {r.step or '-'}, acquired "
            f"{r.acquired_at}, last renewed {_iso(self.modified)} (store clock), ttl {r.ttl_seconds:.0f}s"
        )


@dataclass(frozen=True)
class HeldLease:
    """A lease this process holds: the ETag of its last write is its proof, and the next CAS's condition."""

    model: str
    record: LeaseRecord
    etag: str
    #: ``time.monotonic()`` just before the last successful write: the ttl runs from there, at the latest.
    written: float
    waited_seconds: float = 0.0
    took_over_from: str | None = None

    @property
    def owner(self) -> str:
        return self.record.owner

    def seconds_left(self) -> float:
        """How long the lease surely counts without a renewal (local monotonic clock, conservative)."""
        return self.written + self.record.ttl_seconds - time.monotonic()


class S3ReleaseLease:
    """The release lease of one model on one object-store repository."""

    def __init__(self, store: ObjectStore, model: ModelName) -> None:
        self.store = store
        self.model_name = require_name(model)
        self.key = control_key(model, LEASE)

    def __repr__(self) -> str:
        return f"S3ReleaseLease({self.model_name!r}, {self.store.location})"

    def where(self) -> str:
        return f"s3://{self.store.location.bucket}/{self.store.location.key(self.key)}"

    def view(self) -> LeaseView:
        """The lease as it is now (a ServingError naming the store when it cannot be read)."""
        got: Stamped = self.store.read_stamped(self.key)
        record = None if got.data is None else LeaseRecord.from_bytes(got.data, self.where())
        return LeaseView(record, got.etag, got.modified, got.store_time)

    def _write(self, record: LeaseRecord, etag: str | None) -> str:
        data = record.to_bytes()
        return self.store.create(self.key, data) if etag is None else self.store.replace(self.key, data, etag)

    def acquire(
        self,
        owner: str,
        *,
        step: str = "",
        timeout: float = 60.0,
        ttl: float = DEFAULT_TTL,
        poll: float = 0.5,
        kind: str = "process",
        run: str | None = None,
    ) -> HeldLease:
        """Take the lease for ``owner``, waiting up to ``timeout`` seconds; LeaseError naming the holder after
        (its ``kind`` and ``run`` too: which Airflow run to look at).

        A record ``owner`` wrote earlier (another task of the same run) is taken again, with a new token.
        """
        if not owner:
            raise ValueError("a lease owner id is required")
        started = time.monotonic()
        deadline, announced = started + max(0.0, timeout), None
        while True:
            view = self.view()
            current = view.record
            if current is None or current.released or current.owner == owner or view.expired or view.dead:
                held = self._take(view, owner, step, ttl, started, kind, run)
                if held is not None:
                    return held
                continue  # another contender wrote first: read again, it is the holder now
            if announced != current.token:
                log.info(
                    "waiting up to %.0fs for the release lease of %s: %s", timeout, self.model_name, view.describe()
                )
                announced = current.token
            if time.monotonic() >= deadline:
                raise LeaseError(
                    f"the release lease of model {self.model_name!r} ({self.where()}) is held by {view.describe()}; "
                    f"waited {timeout:.0f}s. Wait for that release to finish and retry; a holder that stops renewing "
                    f"is taken over {current.ttl_seconds:.0f}s after its last renewal."
                )
            time.sleep(max(0.0, min(poll, deadline - time.monotonic())))

    def _take(
        self, view: LeaseView, owner: str, step: str, ttl: float, started: float, kind: str, run: str | None
    ) -> HeldLease | None:
        """One compare-and-swap for the lease over what ``view`` saw; None when another write came first."""
        current = view.record
        record = LeaseRecord(
            owner=owner,
            token=secrets.token_hex(8),
            host=socket.gethostname(),
            pid=os.getpid(),
            ttl_seconds=float(ttl),
            acquired_at=_iso(view.store_time),
            step=step,
            generation=1 if current is None else current.generation + 1,
            kind=kind,
            run=current.run if run is None and current is not None and current.owner == owner else run,
            pid_start=pid_start(os.getpid()),
        )
        written = time.monotonic()
        try:
            etag = self._write(record, view.etag)
        except ObjectConflict:
            log.info("release lease of %s: another contender wrote first", self.model_name)
            return None
        took_over = None
        if current is not None and not current.released and current.owner != owner:
            took_over = view.describe()
            why = view.dead or "its ttl passed"
            log.warning("took over the release lease of %s (%s) from %s", self.model_name, why, took_over)
        log.info("release lease of %s taken by %s (token %s)", self.model_name, owner, record.token[:8])
        return HeldLease(self.model_name, record, etag, written, round(written - started, 3), took_over)

    def _lost(self, held: HeldLease, doing: str, view: LeaseView | None = None) -> LeaseLost:
        try:
            now = (view or self.view()).describe()
        except Exception as exc:  # the store went away too: say so, the conflict already decided
            now = f"unknown ({exc})"
        return LeaseLost(
            f"{held.owner} lost the release lease of model {self.model_name!r} ({self.where()}) while {doing}: "
            f"it is now held by {now}. Stop this release; run `seqcls status --model-name {self.model_name}` "
            "to see what is served."
        )

    def renew(self, held: HeldLease, step: str | None = None) -> HeldLease:
        """Extend the lease (compare-and-swap on the held ETag); LeaseLost when someone else took it.

        A conflict whose record is exactly the one this renewal wrote is a retried PUT meeting its own first
        attempt (the response was lost): the renewal landed, and its ETag is taken from the read.
        """
        step = held.record.step if step is None else step
        record = replace(held.record, generation=held.record.generation + 1, step=step)
        written = time.monotonic()
        try:
            etag = self._write(record, held.etag)
        except ObjectConflict:
            view = self.view()
            if view.record != record or view.etag is None:
                raise self._lost(held, "renewing it", view) from None
            etag = view.etag
        log.debug("release lease of %s renewed by %s (step %s)", self.model_name, held.owner, record.step)
        return replace(held, record=record, etag=etag, written=written)

    def release(self, held: HeldLease) -> bool:
        """Give the lease up (a released record, by CAS); False, with a warning, when it was lost already."""
        record = replace(held.record, generation=held.record.generation + 1, released=True)
        try:
            self._write(record, held.etag)
        except ObjectConflict:
            log.warning("%s", self._lost(held, "releasing it"))
            return False
        log.info("release lease of %s released by %s", self.model_name, held.owner)
        return True

    def break_lease(self, by: str, reason: str, attempts: int = 5) -> LeaseView | None:
        """Free the lease whoever holds it (an operator's decision): a released record naming ``by`` and
        ``reason``, by compare-and-swap over what was read; the view of the holder it broke, None when free.

        The holder finds out at its next renewal or check (its ETag no longer matches: LeaseLost), so a release
        that is in fact still running stops at its next step instead of going on beside the next one."""
        for _ in range(max(1, attempts)):
            view = self.view()
            if view.free:
                return None
            current = view.record
            assert current is not None
            record = replace(current, owner=by, token=secrets.token_hex(8), generation=current.generation + 1,
                             step=f"broken: {reason}", released=True)  # fmt: skip
            try:
                self._write(record, view.etag)
            except ObjectConflict:
                continue  # the holder renewed in between: read again and break that
            log.warning("release lease of %s (%s) broken by %s (%s); it was held by %s",
                        self.model_name, self.where(), by, reason, view.describe())  # fmt: skip
            return view
        raise LeaseError(
            f"the release lease of {self.model_name!r} ({self.where()}) changed on every one of {attempts} "
            "attempts to break it: its holder is renewing it. Stop that release first, then break it again"
        )

    @contextlib.contextmanager
    def hold(
        self, owner: str, *, step: str = "release", timeout: float = 60.0, ttl: float = DEFAULT_TTL, poll: float = 0.5
    ) -> Iterator[LeaseKeeper]:
        """Hold the lease for the block, renewed every ttl/3 by a thread; call ``keeper.check()`` before
        each thing that must happen under it (it raises LeaseLost once the lease is gone)."""
        keeper = LeaseKeeper(self, self.acquire(owner, step=step, timeout=timeout, ttl=ttl, poll=poll))
        beat = threading.Thread(target=keeper.beat, name=f"seqcls-s3lease-{self.model_name}", daemon=True)
        beat.start()
        try:
            yield keeper
        finally:
            keeper.stop.set()
            beat.join(timeout=10)
            if keeper.lost is None:
                self.release(keeper.held)


class LeaseKeeper:
    """The heartbeat of a held lease and what it found (the lost error, if any)."""

    def __init__(self, lease: S3ReleaseLease, held: HeldLease) -> None:
        self.lease, self.held = lease, held
        self.lost: LeaseLost | None = None
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def beat(self) -> None:
        while not self.stop.wait(max(self.held.record.ttl_seconds / 3.0, 0.05)):
            try:
                renewed = self.lease.renew(self.held)
            except LeaseLost as exc:
                log.error("%s", exc)
                self.lost = exc
                return
            except Exception as exc:  # the store is unreachable: retry at the next beat; check() sees the ttl run out
                log.error("could not renew the release lease of %s: %s", self.lease.model_name, exc)
                continue
            with self._lock:
                self.held = renewed

    def check(self) -> HeldLease:
        """The held lease, or LeaseLost if it was taken over or its ttl ran out without a renewal."""
        with self._lock:
            held = self.held
        if self.lost is not None:
            raise self.lost
        if held.seconds_left() <= 0:
            raise LeaseLost(
                f"the release lease of model {self.lease.model_name!r} ({self.lease.where()}) was not renewed within "
                f"its ttl of {held.record.ttl_seconds:.0f}s (is the store reachable?); another release may have taken "
                "it over. Stop this release."
            )
        return held


__all__ = [
    "CONTROL",
    "DEFAULT_TTL",
    "HeldLease",
    "LeaseKeeper",
    "LeaseLost",
    "LeaseRecord",
    "LeaseView",
    "S3ReleaseLease",
    "control_key",
]
