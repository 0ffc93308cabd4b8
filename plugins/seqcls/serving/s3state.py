"""The recorded serving state of a model on an ``s3://`` repository: a CAS-replaced document and an event log.

Why compare-and-swap instead of the POSIX state's lock and rename (:mod:`seqcls.serving.state`): a store
has neither. The current state, :func:`~seqcls.serving.s3lease.control_key` ``(model, "state.json")``
(the same record as :class:`~seqcls.serving.state.ServingState`), is replaced only with ``If-Match`` on
the ETag that was read, so a writer that read an older state gets a conflict, never a lost update:
:meth:`S3ServingState.update` re-reads, re-applies its change and tries again, a bounded number of times.

The history is an append-only log of immutable objects, ``log/<seq:012d>.json``, each created with
``If-None-Match: *`` and its sha256: two writers racing for one sequence number — one wins, the other takes
the next. An object is written whole or not at all and checked on read, so there is no torn line; an
event that does not check out is skipped with a warning and reported. Zero-padded numbers list in order,
so the newest N are read from the listing's tail without reading the rest.

A state is recorded only if it can be applied: every version it newly names (served, previous,
candidate) must be complete on the store — its manifest present (:mod:`seqcls.serving.s3repo`) for each
of the model's four Triton models — else it is refused naming model, version and the missing marker.
The state is written first (it is the truth), its event after; an event that cannot be written is a
warning, and the next event's ``before`` shows the gap.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from seqcls.contract.names import ModelName, require_name
from seqcls.errors import ServingError
from seqcls.serving.objectstore import ObjectConflict, ObjectIntegrityError, ObjectStore
from seqcls.serving.s3lease import control_key
from seqcls.serving.s3repo import MANIFEST, S3Repository
from seqcls.serving.servingstate import ServingState
from seqcls.serving.statelog import actor, now_iso

log = logging.getLogger(__name__)

STATE = "state.json"
LOG = "log/"
SEQ_DIGITS = 12
_EVENT_RE = re.compile(rf"^\d{{{SEQ_DIGITS}}}\.json$")
#: Conflicts in a row before an append lists the log again instead of trying the next number (its guess, the
#: number after its own last append, is far behind when others appended many events meanwhile).
_RELIST_AFTER = 8


class StateConflict(ObjectConflict):
    """The state changed between read and write (another writer won); re-read and decide again."""


@dataclass(frozen=True)
class StateRead:
    """A state as read, with the ETag a write must match (None: no state recorded yet)."""

    state: ServingState
    etag: str | None


@dataclass(frozen=True)
class StateWrite:
    """A recorded state: its new ETag, how many attempts it took, how long, and its log event."""

    state: ServingState
    etag: str
    attempts: int
    seconds: float
    event_seq: int | None


@dataclass(frozen=True)
class LogEvent:
    """One event of the log: its sequence number and record."""

    seq: int
    record: dict[str, Any]


@dataclass(frozen=True)
class LogRead:
    """Events read in order, and the keys skipped because they did not check out (named in a warning)."""

    events: tuple[LogEvent, ...]
    skipped: tuple[str, ...] = ()


def _live(state: ServingState) -> dict[str, int | None]:
    return {"serving": state.serving, "previous": state.previous, "candidate": state.candidate}


class S3ServingState:
    """The recorded serving state and event log of one model on one object-store repository."""

    def __init__(self, store: ObjectStore, model: ModelName) -> None:
        self.store = store
        self.model_name = require_name(model)
        self.repository = S3Repository(store)
        self.key = control_key(model, STATE)
        self.log_prefix = control_key(model, LOG)
        #: The number after this instance's last append: the next append tries it without listing the log.
        self._next_seq: int | None = None

    def __repr__(self) -> str:
        return f"S3ServingState({self.model_name!r}, {self.store.location})"

    def uri(self, key: str) -> str:
        return f"s3://{self.store.location.bucket}/{self.store.location.key(key)}"

    # ------------------------------------------------------------------ the state

    def read(self) -> StateRead:
        """The recorded state (empty, ETag None, when none is); a ServingError naming the object when unreadable."""
        got = self.store.read(self.key)
        if got is None:
            return StateRead(ServingState.empty(self.model_name), None)
        data, etag = got
        try:
            state = ServingState.from_dict(json.loads(data.decode("utf-8")))
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ServingError(
                f"{self.uri(self.key)}: the recorded serving state of {self.model_name!r} is unreadable ({exc}); "
                "rebuild it from the log (`events()`) before any release"
            ) from None
        if state.model_name != self.model_name:
            raise ServingError(f"{self.uri(self.key)} records model {state.model_name!r}, not {self.model_name!r}")
        return StateRead(replace(state, model_name=self.model_name), etag)  # the checked name, as the POSIX reader

    def check_applicable(self, state: ServingState, base: ServingState) -> None:
        """Refuse ``state`` if a version it names and ``base`` did not is incomplete on the store."""
        names = self.model_name.names.models
        for role, version in _live(state).items():
            if version is None or version in base.live_versions():
                continue
            for triton in names:
                if self.repository.manifest(triton, version) is None:
                    raise ServingError(
                        f"the serving state of model {self.model_name!r} may not name version {version} as "
                        f"{role}: {triton} version {version} is not complete on {self.store.location} (its marker "
                        f"{self.repository.uri(f'{triton}/{version}/{MANIFEST}')} is missing). Publish the version "
                        "whole first; nothing was recorded."
                    )

    def write(self, state: ServingState, read: StateRead) -> StateWrite:
        """Record ``state`` over what ``read`` saw (``If-Match`` on its ETag); StateConflict if it changed since."""
        started = time.monotonic()
        self.check_applicable(state, read.state)
        new = replace(state, generation=read.state.generation + 1, updated_at=now_iso())
        # ``write_id``: two writers deciding the same change in the same second still write different bytes
        document = {**new.to_dict(), "write_id": secrets.token_hex(8)}
        data = (json.dumps(document, indent=1) + "\n").encode("utf-8")
        try:
            if read.etag is None:
                etag = self.store.create(self.key, data)
            else:
                etag = self.store.replace(self.key, data, read.etag)
        except ObjectConflict:
            landed = self.store.read(self.key)  # a retried PUT meeting its own first attempt wrote these bytes
            if landed is None or landed[0] != data:
                raise StateConflict(
                    f"{self.uri(self.key)}: the serving state of {self.model_name!r} changed since it was read "
                    f"(generation {read.state.generation}); another writer won. Read it again and decide from it."
                ) from None
            etag = landed[1]
        seq = self._state_event(new, read.state)
        seconds = round(time.monotonic() - started, 3)
        log.info(
            "recorded %s of %s as generation %d in %.2fs", new.describe(), self.model_name, new.generation, seconds
        )
        return StateWrite(new, etag, 1, seconds, seq)

    def update(
        self, change: Callable[[ServingState], ServingState], *, attempts: int = 5, sleep: float = 0.05
    ) -> StateWrite:
        """Read, apply ``change`` (a pure transition), write by CAS; after a conflict, all three again.

        Why re-apply rather than re-write: the change is decided on the state the winner left, so nothing
        the winner recorded is lost. After ``attempts`` conflicts in a row it gives up, saying so.
        """
        started = time.monotonic()
        for attempt in range(1, attempts + 1):
            read = self.read()
            try:
                written = self.write(change(read.state), read)
            except StateConflict:
                log.info("serving state of %s: attempt %d lost a race; re-reading", self.model_name, attempt)
                time.sleep(sleep * attempt)
                continue
            return replace(written, attempts=attempt, seconds=round(time.monotonic() - started, 3))
        raise StateConflict(
            f"{self.uri(self.key)}: the serving state of {self.model_name!r} changed under every one of {attempts} "
            "attempts (another writer keeps winning); nothing was recorded by this one. Is a release running "
            "without the release lease?"
        )

    # ------------------------------------------------------------------ the log

    def _state_event(self, new: ServingState, before: ServingState) -> int | None:
        entries = [e.to_dict() for e in new.history[len(new.history) - new.appended :]] if new.appended else []
        record = {"event": "state", "generation": new.generation, "state": _live(new), "before": _live(before)}
        record |= {"before_generation": before.generation, "entries": entries}
        try:
            return self.append(record).seq
        except ServingError as exc:
            log.warning("serving state of %s recorded, but its log event was not: %s", self.model_name, exc)
            return None

    def event_count(self) -> int:
        """How many events the log holds (one listing, nothing read)."""
        return len(self._event_keys())

    def _event_keys(self) -> list[str]:
        return [k for k in self.store.list(self.log_prefix) if _EVENT_RE.match(k[len(self.log_prefix) :])]

    def _seq(self, key: str) -> int:
        return int(key[len(self.log_prefix) :].split(".")[0])

    def append(self, record: dict[str, Any]) -> LogEvent:
        """Add ``record`` (with when, who and a unique id) as the next event; a lost race takes the next number."""
        record = {**record, "at": now_iso(), "who": actor(), "id": secrets.token_hex(8)}
        data = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
        conflicts, seq = 0, self._next_seq
        while True:
            if seq is None or (conflicts and conflicts % _RELIST_AFTER == 0):
                keys = self._event_keys()
                seq = (self._seq(keys[-1]) if keys else 0) + 1
            key = f"{self.log_prefix}{seq:0{SEQ_DIGITS}d}.json"
            try:
                self.store.put_immutable(key, data)
            except ObjectConflict:
                conflicts += 1
                seq += 1
                log.debug("event log of %s: %s was taken; trying %d", self.model_name, key, seq)
                continue
            self._next_seq = seq + 1
            log.info("event %d of %s: %s", seq, self.model_name, record.get("event", "?"))
            return LogEvent(seq, record)

    def events(self, last: int | None = None) -> LogRead:
        """The log in order (only the newest ``last`` when given: the listing's tail, nothing else is read)."""
        keys = self._event_keys()
        if last is not None:
            keys = keys[-last:] if last > 0 else []
        events, skipped = [], []
        for key in keys:
            try:
                data = self.store.read_immutable(key)
                if data is None:  # listed, then gone: only gc removes events
                    raise ObjectIntegrityError(f"{self.uri(key)} was listed but is gone")
                events.append(LogEvent(self._seq(key), json.loads(data.decode("utf-8"))))
            except (ObjectIntegrityError, ValueError) as exc:
                log.warning("event log of %s: skipped %s: %s", self.model_name, self.uri(key), exc)
                skipped.append(key)
        return LogRead(tuple(events), tuple(skipped))


__all__ = ["LogEvent", "LogRead", "S3ServingState", "StateConflict", "StateRead", "StateWrite"]
