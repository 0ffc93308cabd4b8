"""One release at a time per model, across processes and machines that share the model repository.

A release spans processes (Airflow runs publish → reload → smoke → promote as separate tasks of
one DAG run), so the lease is a record with an owner id, not a file descriptor held throughout:
``<repository>/.seqcls-lease.<model_name>.json``. Network file systems: ``flock`` on a Linux NFS
client is emulated with POSIX byte-range locks (NLM for NFSv3, native in NFSv4 with server-side
lease expiry), and we hold it only for sub-second read-modify-writes of that record, never while
waiting. The lease itself is data — owner, ``renewed_at`` and a ttl — replaced atomically by a
same-directory rename (atomic on POSIX and on NFS), so a crashed machine's lease expires by its
ttl instead of relying on the file system's lock recovery; a dead holder on this host is
recovered at once from its pid. Clocks across machines must roughly agree (ttl ≫ clock skew).
Object stores give neither rename nor locks: on a store's working copy (:mod:`seqcls.serving.storeroot`) this
class keeps the lease on the store instead, by compare-and-swap (:mod:`seqcls.serving.s3lease`), with the
same owner-keyed API.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from seqcls.contract.names import ModelName, require_name
from seqcls.errors import LeaseError, ServingError
from seqcls.files import atomic_write
from seqcls.serving.pids import pid_alive, pid_start
from seqcls.serving.s3lease import HeldLease, LeaseView, S3ReleaseLease
from seqcls.serving.storeroot import store_at

log = logging.getLogger(__name__)

LEASE_PREFIX = ".seqcls-lease."
KINDS = ("process", "run")
DEFAULT_TTL = 900.0  # seconds; a holder renews at every step, a CLI holder also from a heartbeat
Kind = Literal["process", "run"]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _epoch(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def process_owner() -> str:
    """Owner id of a single-process release (the CLI): ``cli:<host>:<pid>``."""
    return f"cli:{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a model's release lease, since when, and until when it counts without renewal."""

    owner: str
    kind: str
    host: str
    pid: int
    run: str | None
    since: str
    renewed_at: str
    ttl_seconds: float
    step: str
    pid_start: float | None = None  # guards against pid reuse on the same host

    @property
    def expires_at(self) -> float:
        return _epoch(self.renewed_at) + float(self.ttl_seconds)

    def describe(self) -> str:
        return (
            f"{self.owner} ({self.kind}) on host {self.host}, pid {self.pid}, run {self.run or '-'}, "
            f"step {self.step}, since {self.since}, last renewed {self.renewed_at}, "
            f"expires {_iso(self.expires_at)} unless renewed"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LeaseHolder:
        if not isinstance(d, dict):
            raise ValueError("expected a JSON object")
        holder = cls(
            owner=str(d["owner"]),
            kind=str(d["kind"]),
            host=str(d["host"]),
            pid=int(d["pid"]),
            run=None if d.get("run") is None else str(d["run"]),
            since=str(d["since"]),
            renewed_at=str(d["renewed_at"]),
            ttl_seconds=float(d["ttl_seconds"]),
            step=str(d.get("step", "")),
            pid_start=None if d.get("pid_start") is None else float(d["pid_start"]),
        )
        holder.expires_at  # noqa: B018 - validates the timestamps
        return holder


class ReleaseLease:
    """The release lease of one model in one shared repository."""

    def __init__(self, repository: Path, model: ModelName) -> None:
        self.repository = Path(repository)
        self.model_name = require_name(model)
        self.path = self.repository / f"{LEASE_PREFIX}{model}.json"
        self.lock_path = self.repository / f"{LEASE_PREFIX}{model}.lock"
        store = store_at(self.repository)
        #: On a store's working copy: the lease on the store (every method below hands over to it).
        self.store_lease = None if store is None else StoreLease(S3ReleaseLease(store, self.model_name))

    # ------------------------------------------------------------------ internals

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The short flock around one read-modify-write of the lease record."""
        self.repository.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _read(self) -> LeaseHolder | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise LeaseError(f"{self.path}: cannot read the release lease of {self.model_name!r}: {exc}") from exc
        try:  # binary garbage is a UnicodeDecodeError, a ValueError: the same clear error as bad JSON
            return LeaseHolder.from_dict(json.loads(raw.decode("utf-8")))
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise LeaseError(
                f"{self.path}: the release lease record of {self.model_name!r} is unreadable ({exc}). If no "
                f"release of it is running, run `seqcls lease break --model-name {self.model_name}`."
            ) from exc

    def _write(self, holder: LeaseHolder) -> None:
        atomic_write(self.path, json.dumps(holder.to_dict(), indent=2) + "\n")

    def dead_reason(self, holder: LeaseHolder, now: float | None = None) -> str | None:
        """Why ``holder`` no longer counts (None while it does)."""
        if self.store_lease is not None:  # expiry on the store's clock; a pid is checked on its own host only
            view = self.store_lease.lease.view()
            return f"its ttl of {holder.ttl_seconds:.0f}s passed on the store's clock" if view.expired else view.dead
        now = time.time() if now is None else now
        same_host = holder.kind == "process" and holder.host == socket.gethostname()
        if same_host and holder.pid != os.getpid() and not pid_alive(holder.pid, holder.pid_start):
            return f"its process {holder.pid} on this host ({holder.host}) is gone"
        if now > holder.expires_at:
            return f"it was last renewed {holder.renewed_at} and its ttl of {holder.ttl_seconds:.0f}s has passed"
        return None

    def _new_holder(
        self, owner: str, kind: str, run: str | None, step: str, ttl: float, since: str | None = None
    ) -> LeaseHolder:
        now = _iso(time.time())
        pid = os.getpid()
        return LeaseHolder(
            owner=owner,
            kind=kind,
            host=socket.gethostname(),
            pid=pid,
            run=run,
            since=since or now,
            renewed_at=now,
            ttl_seconds=float(ttl),
            step=step,
            pid_start=pid_start(pid),
        )

    # ------------------------------------------------------------------ API

    def holder(self) -> LeaseHolder | None:
        """The recorded holder (possibly dead: see :meth:`dead_reason`); None when free."""
        if self.store_lease is not None:
            return self.store_lease.holder()
        return self._read()

    def acquire(
        self,
        owner: str,
        *,
        kind: Kind = "process",
        run: str | None = None,
        step: str = "",
        timeout: float = 60.0,
        ttl: float = DEFAULT_TTL,
        poll: float = 0.5,
    ) -> LeaseHolder:
        """Take the lease for ``owner`` (again, if it already holds it), waiting up to ``timeout`` seconds.

        Raises LeaseError naming the holder when it is still held by someone else after the wait.
        """
        if kind not in KINDS:
            raise ValueError(f"lease kind {kind!r} is not one of {', '.join(KINDS)}")
        if not owner:
            raise ValueError("a lease owner id is required")
        if self.store_lease is not None:
            return self.store_lease.acquire(owner, kind=kind, run=run, step=step, timeout=timeout, ttl=ttl, poll=poll)
        deadline = time.monotonic() + max(0.0, timeout)
        waited_for: str | None = None
        while True:
            with self._locked():
                current = self._read()
                if current is not None and current.owner == owner:
                    holder = self._new_holder(owner, kind, run or current.run, step, ttl, since=current.since)
                    self._write(holder)
                    log.debug("release lease of %s re-taken by %s (step %s)", self.model_name, owner, step)
                    return holder
                reason = None if current is None else self.dead_reason(current)
                if current is None or reason is not None:
                    if current is not None:
                        log.warning(
                            "recovered the release lease of %s from dead holder %s: %s",
                            self.model_name,
                            current.describe(),
                            reason,
                        )
                    holder = self._new_holder(owner, kind, run, step, ttl)
                    self._write(holder)
                    log.info("release lease of %s taken by %s (step %s)", self.model_name, owner, step)
                    return holder
            if waited_for != current.owner:
                log.info(
                    "waiting up to %.0fs for the release lease of %s: %s", timeout, self.model_name, current.describe()
                )
                waited_for = current.owner
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LeaseError(
                    f"the release lease of model {self.model_name!r} is held by {current.describe()}; waited "
                    f"{timeout:.0f}s. Wait for that release to finish and retry. If the holder is surely dead "
                    f"(its machine is gone), run `seqcls lease break --model-name {self.model_name}`, then "
                    f"`seqcls sync --model-name {self.model_name}`. (lease file: {self.path})"
                )
            time.sleep(min(poll, remaining))

    def renew(self, owner: str, step: str | None = None) -> LeaseHolder:
        """Extend ``owner``'s lease (and record the step it is at); LeaseError if it lost the lease."""
        if self.store_lease is not None:
            return self.store_lease.renew(owner, step)
        with self._locked():
            current = self._read()
            if current is None or current.owner != owner:
                held = "nobody holds it" if current is None else f"it is held by {current.describe()}"
                raise LeaseError(
                    f"{owner} lost the release lease of model {self.model_name!r}: {held}. Stop this release; "
                    f"run `seqcls status --model-name {self.model_name}` to see what is served."
                )
            pid = os.getpid()
            holder = replace(
                current,
                renewed_at=_iso(time.time()),
                step=current.step if step is None else step,
                host=socket.gethostname(),
                pid=pid,
                pid_start=current.pid_start if pid == current.pid else pid_start(pid),
            )
            self._write(holder)
            return holder

    def release(self, owner: str) -> bool:
        """Give the lease up; never removes someone else's (returns whether it released)."""
        if self.store_lease is not None:
            return self.store_lease.release(owner)
        with self._locked():
            current = self._read()
            if current is None:
                log.debug("release lease of %s: %s released it, but it was free", self.model_name, owner)
                return False
            if current.owner != owner:
                log.warning(
                    "release lease of %s: %s tried to release it, but it is held by %s; left alone",
                    self.model_name,
                    owner,
                    current.describe(),
                )
                return False
            self.path.unlink(missing_ok=True)
        log.info("release lease of %s released by %s", self.model_name, owner)
        return True

    def break_lease(self, by: str, reason: str) -> LeaseHolder | None:
        """Remove the lease whoever holds it (an operator's decision); returns the holder it removed."""
        if self.store_lease is not None:
            return self.store_lease.break_lease(by, reason)
        with self._locked():
            try:
                current = self._read()
            except LeaseError:
                current = None  # unreadable: breaking it is exactly the remedy
            existed = self.path.exists()
            self.path.unlink(missing_ok=True)
        if existed:
            log.warning(
                "release lease of %s broken by %s (%s); it was held by %s",
                self.model_name,
                by,
                reason,
                current.describe() if current else "an unreadable record",
            )
        return current

    @contextlib.contextmanager
    def hold(
        self,
        owner: str | None = None,
        *,
        kind: Kind = "process",
        run: str | None = None,
        step: str = "release",
        timeout: float = 60.0,
        ttl: float = DEFAULT_TTL,
        poll: float = 0.5,
        heartbeat: bool = True,
    ) -> Iterator[LeaseHolder]:
        """Hold the lease for the block (single-process use: the CLI), renewed every ttl/3 meanwhile."""
        owner = owner or process_owner()
        holder = self.acquire(owner, kind=kind, run=run, step=step, timeout=timeout, ttl=ttl, poll=poll)
        stop = threading.Event()
        beat = None
        if heartbeat:

            def _beat() -> None:
                while not stop.wait(max(ttl / 3.0, 0.05)):
                    try:
                        self.renew(owner)
                    except Exception as exc:  # lost it or the volume is gone: the next renew/step tells
                        log.error("could not renew the release lease of %s: %s", self.model_name, exc)
                        return

            beat = threading.Thread(target=_beat, name=f"seqcls-lease-{self.model_name}", daemon=True)
            beat.start()
        try:
            yield holder
        finally:
            stop.set()
            if beat is not None:
                beat.join(timeout=5)
            self.release(owner)


#: Leases this process holds on stores, by (lease object key, owner): the ETag of the last write is the proof.
_HELD: dict[tuple[str, str], HeldLease] = {}
_HELD_LOCK = threading.Lock()


class StoreLease:
    """The owner-keyed API of :class:`ReleaseLease` over :class:`~seqcls.serving.s3lease.S3ReleaseLease`.

    Why: the release steps take the lease by owner id (several steps of one release re-enter it); the store's
    lease is token-based. This process keeps the token it holds per owner; an owner that re-enters takes the
    lease again (a new token, the previous write's ETag)."""

    def __init__(self, lease: S3ReleaseLease) -> None:
        self.lease = lease

    def _key(self, owner: str) -> tuple[str, str]:
        return (self.lease.where(), owner)

    @staticmethod
    def _holder(view: LeaseView) -> LeaseHolder | None:
        r = view.record
        if r is None or r.released:
            return None
        renewed = (view.modified or datetime.now(UTC)).timestamp()
        return LeaseHolder(r.owner, r.kind, r.host, r.pid, r.run, r.acquired_at, _iso(renewed), r.ttl_seconds, r.step)

    def holder(self) -> LeaseHolder | None:
        return self._holder(self.lease.view())

    def acquire(
        self, owner: str, *, kind: str, run: str | None, step: str, timeout: float, ttl: float, poll: float
    ) -> LeaseHolder:
        held = self.lease.acquire(owner, step=step, timeout=timeout, ttl=ttl, poll=poll, kind=kind, run=run)
        with _HELD_LOCK:
            _HELD[self._key(owner)] = held
        return self._holder(self.lease.view()) or self._from_held(held)

    @staticmethod
    def _from_held(held: HeldLease) -> LeaseHolder:
        r, now = held.record, _iso(time.time())
        return LeaseHolder(r.owner, r.kind, r.host, r.pid, r.run, r.acquired_at, now, r.ttl_seconds, r.step)

    def renew(self, owner: str, step: str | None) -> LeaseHolder:
        with _HELD_LOCK:
            held = _HELD.get(self._key(owner))
        if held is None:  # another process of this owner took it (an Airflow task): take it again
            return self.acquire(owner, kind="run", run=None, step=step or "", timeout=0.0, ttl=DEFAULT_TTL, poll=0.5)
        held = self.lease.renew(held, step)
        with _HELD_LOCK:
            _HELD[self._key(owner)] = held
        return self._from_held(held)

    def break_lease(self, by: str, reason: str) -> LeaseHolder | None:
        view = self.lease.break_lease(by, reason)
        return None if view is None else self._holder(view)

    def release(self, owner: str) -> bool:
        with _HELD_LOCK:
            held = _HELD.pop(self._key(owner), None)
        if held is None:
            view = self.lease.view()
            if view.record is None or view.record.released or view.record.owner != owner:
                return False
            held = self.lease.acquire(owner, step="release", timeout=0.0)  # this owner's, from another process
        try:
            return self.lease.release(held)
        except ServingError as exc:  # the store unreachable: the release's own outcome must not be replaced by this
            log.warning("release lease of %s not released (%s): it expires after its ttl", self.lease.model_name, exc)
            return False


__all__ = [
    "DEFAULT_TTL",
    "KINDS",
    "LeaseError",
    "LeaseHolder",
    "ReleaseLease",
    "StoreLease",
    "process_owner",
]
