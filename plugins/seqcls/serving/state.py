"""The recorded serving state: what each model SHOULD serve, kept with the shared model repository.

A release workspace cannot be the truth about serving: it does not survive a second release, a
crash or a restarted Triton. So, per model, one small JSON record lives at the root of the model
repository every endpoint shares: ``<repository>/.seqcls-state.<model_name>.json``. A plain file,
not a directory, because Triton lists every subdirectory of the repository as a model. It says
which version the public ensemble serves, which previous version is kept warm for an instant
rollback, which candidate is loaded for smoke on a private route, and a short history.

Writes are atomic (:func:`seqcls.files.atomic_write`: temp file, fsync, rename, directory fsync) and
optimistic: a writer names the generation it read, and a write over anyone else's newer record is
refused. The previous good content is kept as ``<file>.bak`` so an operator can restore it.
Transitions (:meth:`ServingState.promoted` …) are pure, so they can be tested and previewed
without touching the disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from seqcls.contract.names import ModelName, require_name
from seqcls.errors import ServingError
from seqcls.files import atomic_write
from seqcls.serving.repository import Repository
from seqcls.serving.statelog import (
    EVENTS,
    STATE_PREFIX,
    actor,
    append_event,
    append_line,
    fold_states,
    log_path,
    now_iso,
    read_lines,
    read_tail,
    retained,
)

log = logging.getLogger(__name__)

SCHEMA = 1
HISTORY_LIMIT = 50
ACTIONS = ("release", "rollback", "candidate", "abandon", "adopt")
#: Actions after which ``version`` is what the public ensemble serves.
_SERVING_ACTIONS = ("release", "rollback", "adopt")


def state_path(repository: Path, model: ModelName) -> Path:
    """Where ``model``'s state lives: a dot file at the repository root (Triton ignores files)."""
    return Path(repository) / f"{STATE_PREFIX}{require_name(model)}.json"


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


def _version(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer or null, got {value!r}")
    return value


def _text(value: Any, what: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {value!r}")
    return value


@dataclass(frozen=True)
class HistoryEntry:
    """One change of the recorded state: which version, what happened, when, and by which run."""

    version: int | None
    fingerprint: str | None
    action: str
    at: str
    by: str
    note: str = ""

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"history action {self.action!r} is not one of {', '.join(ACTIONS)}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "fingerprint": self.fingerprint,
            "action": self.action,
            "at": self.at,
            "by": self.by,
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HistoryEntry:
        if not isinstance(d, dict):
            raise ValueError(f"history entry must be an object, got {d!r}")
        return cls(
            version=_version(d.get("version"), "history version"),
            fingerprint=_text(d.get("fingerprint"), "history fingerprint", optional=True),
            action=str(_text(d.get("action"), "history action")),
            at=str(_text(d.get("at"), "history at")),
            by=str(_text(d.get("by"), "history by")),
            note=str(_text(d.get("note", ""), "history note")),
        )


@dataclass(frozen=True)
class ServingState:
    """What ``model_name`` should serve; changed only under its release lease, then reconciled."""

    model_name: ModelName
    serving: int | None = None
    previous: int | None = None
    candidate: int | None = None
    history: list[HistoryEntry] = field(default_factory=list)
    generation: int = 0
    updated_at: str = ""
    #: Highest Triton version number ever allocated for this model: never decreases, so a version
    #: number is never reused even when its directory was deleted.
    published: int = 0
    #: History entries appended since this state was read or written: what :func:`write_state` logs.
    appended: int = field(default=0, compare=False, repr=False)

    @classmethod
    def empty(cls, model: ModelName) -> ServingState:
        return cls(model_name=require_name(model))

    def live_versions(self) -> list[int]:
        """Versions the composing models must have loaded (serving, previous, candidate)."""
        return sorted({v for v in (self.serving, self.previous, self.candidate) if v is not None})

    def fingerprint_of(self, version: int | None) -> str | None:
        """The newest fingerprint the history records for ``version``."""
        for entry in reversed(self.history):
            if entry.version == version and entry.fingerprint:
                return entry.fingerprint
        return None

    def describe(self) -> str:
        live = f"serving {self.serving}, previous {self.previous}, candidate {self.candidate}"
        return f"{live} (generation {self.generation})"

    def known_versions(self) -> set[int]:
        """Every version the state names, now or in its history."""
        named = {v for v in (self.serving, self.previous, self.candidate) if v is not None}
        return named | {e.version for e in self.history if e.version is not None}

    def protected_versions(self, depth: int | None = None) -> set[int]:
        """Serving, previous, candidate and what the next ``depth`` rollbacks serve (None: the whole chain,
        until it stops or cycles) — what retention must never prune."""
        protected = set(self.live_versions())
        state, seen = self, set()
        while state.previous is not None and (state.serving, state.previous) not in seen:
            if depth is not None and len(seen) >= depth:
                break
            seen.add((state.serving, state.previous))
            state = state.rolled_back("protected_versions")
            protected.update(state.live_versions())
        return protected

    # ------------------------------------------------------------------ transitions (no I/O)

    def allocated(self, version: int) -> ServingState:
        """Reserve ``version`` for a publish: it must be above every number ever allocated."""
        _version(version, "allocated version")
        if version <= self.published:
            raise ServingError(
                f"{self.model_name}: version {version} was already allocated (the highest allocated is "
                f"{self.published}); a version number is never reused — publish as {self.published + 1} or above"
            )
        return replace(self, published=version)

    def _with(self, entry: HistoryEntry, **changes: Any) -> ServingState:
        named = [v for v in (entry.version, *changes.values()) if isinstance(v, int) and not isinstance(v, bool)]
        new = replace(self, history=[*self.history, entry], published=max([self.published, *named]), **changes)
        return replace(new, history=bounded_history(new.history, new.live_versions()), appended=self.appended + 1)

    def with_candidate(self, version: int, fingerprint: str | None, by: str) -> ServingState:
        """A release loads ``version`` beside the served one, on a route unpinned clients don't take."""
        _version(version, "candidate version")
        if self.candidate is not None and self.candidate != version:
            raise ServingError(
                f"{self.model_name}: version {self.candidate} is already the candidate of a release in flight; "
                f"abandon it (or let that release finish) before making version {version} the candidate"
            )
        entry = HistoryEntry(version, fingerprint, "candidate", now_iso(), by)
        return self._with(entry, candidate=version)

    def promoted(self, version: int, fingerprint: str | None, by: str) -> ServingState:
        """Smoke passed: ``version`` becomes public, the old served version stays warm as previous."""
        _version(version, "promoted version")
        if self.candidate is not None and self.candidate != version:
            raise ServingError(
                f"{self.model_name}: cannot promote version {version} while version {self.candidate} is the "
                "candidate; only the smoked candidate may be promoted"
            )
        previous = self.previous if self.serving in (None, version) else self.serving
        if previous == version:
            previous = None
        entry = HistoryEntry(version, fingerprint, "release", now_iso(), by)
        return self._with(entry, serving=version, previous=previous, candidate=None)

    def rolled_back(self, by: str, note: str = "") -> ServingState:
        """Serve the previous version again; the one served before it becomes the new previous."""
        if self.previous is None:
            raise ServingError(
                f"{self.model_name}: nothing to roll back to — the recorded state has no previous version "
                f"(serving {self.serving}). Release the version you want instead."
            )
        target = self.previous
        entry = HistoryEntry(target, self.fingerprint_of(target), "rollback", now_iso(), by, note)
        return self._with(entry, serving=target, previous=self._served_before(target))

    def without_candidate(self, by: str, note: str = "") -> ServingState:
        """Drop the in-flight candidate (failed smoke, abandoned release); no-op when there is none."""
        if self.candidate is None:
            return self
        entry = HistoryEntry(self.candidate, self.fingerprint_of(self.candidate), "abandon", now_iso(), by, note)
        return self._with(entry, candidate=None)

    def _served_before(self, version: int) -> int | None:
        """The version served just before ``version`` was last released or adopted (None if unknown)."""
        served: list[int | None] = []  # serving value after each history entry
        current: int | None = None
        for entry in self.history:
            if entry.action in _SERVING_ACTIONS:
                current = entry.version
            served.append(current)
        for i in range(len(self.history) - 1, -1, -1):
            entry = self.history[i]
            if entry.version == version and entry.action in ("release", "adopt"):
                for before in reversed(served[:i]):
                    if before is not None and before != version:
                        return before
                return None
        return None

    # ------------------------------------------------------------------ records

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model_name": self.model_name,
            "serving": self.serving,
            "previous": self.previous,
            "candidate": self.candidate,
            "generation": self.generation,
            "updated_at": self.updated_at,
            "published": self.published,
            "history": [e.to_dict() for e in self.history],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServingState:
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, got {type(d).__name__}")
        if d.get("schema", SCHEMA) != SCHEMA:
            raise ValueError(f"schema {d.get('schema')!r} is not {SCHEMA} (written by another seqcls version?)")
        missing = [k for k in ("model_name", "serving", "previous", "candidate", "generation") if k not in d]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        generation = d["generation"]
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
            raise ValueError(f"generation must be a non-negative integer, got {generation!r}")
        history = d.get("history", [])
        if not isinstance(history, list):
            raise ValueError("history must be a list")
        state = cls(
            model_name=str(_text(d["model_name"], "model_name")),
            serving=_version(d["serving"], "serving"),
            previous=_version(d["previous"], "previous"),
            candidate=_version(d["candidate"], "candidate"),
            history=[HistoryEntry.from_dict(e) for e in history],
            generation=generation,
            updated_at=str(_text(d.get("updated_at", ""), "updated_at")),
        )
        known = max(state.known_versions(), default=0)
        published = d.get("published")
        if published is None:  # written before the counter: derive it from what the state names
            return replace(state, published=known)
        if isinstance(published, bool) or not isinstance(published, int) or published < 0:
            raise ValueError(f"published must be a non-negative integer, got {published!r}")
        return replace(state, published=max(published, known))


def bounded_history(history: list[HistoryEntry], live: list[int]) -> list[HistoryEntry]:
    """``history`` cut to :data:`HISTORY_LIMIT` entries without forgetting what status and rollback need.

    Pinned: the newest fingerprinted entry of each live version (the served fingerprint is how
    status finds the champion). Dropped first: the oldest candidate/abandon entries (a scheduled
    run retrying one checkpoint writes two per attempt), then the oldest releases/rollbacks. The
    full record is the append-only log beside the state (:func:`log_path`).
    """
    excess = len(history) - HISTORY_LIMIT
    if excess <= 0:
        return history
    pinned = set()
    for version in live:
        newest = [i for i, e in enumerate(history) if e.version == version and e.fingerprint]
        pinned.update(newest[-1:])
    unpinned = [i for i in range(len(history)) if i not in pinned]
    noise = [i for i in unpinned if history[i].action not in _SERVING_ACTIONS]
    served = [i for i in unpinned if history[i].action in _SERVING_ACTIONS]
    drop = set((noise + served)[:excess])
    return [e for i, e in enumerate(history) if i not in drop]


# ---------------------------------------------------------------------------- disk


def _corrupt(path: Path, model_name: str, what: str) -> ServingError:
    bak, log_file = backup_path(path), log_path(path.parent, model_name)
    copy = recovered_state(path.parent, model_name)
    fix = (
        f"`seqcls sync --model-name {model_name}` records its newest readable copy again (generation "
        f"{copy.generation}, from {bak} or {log_file.name})"
        if copy
        else f"neither {bak} nor {log_file.name} holds a readable copy: delete {path.name} — seqcls then "
        "reconstructs the state from what the repository's config.pbtxt files serve, and keeps serving it — and "
        f"run `seqcls sync --model-name {model_name}`"
    )
    return ServingError(
        f"{path}: the recorded serving state of {model_name!r} is unreadable ({what}). Nothing was changed. "
        f"Check `seqcls status --model-name {model_name}`; {fix}."
    )


def _parse(raw: bytes, model_name: str) -> ServingState:
    """A state file's bytes as a ServingState; ValueError (naming the problem) for anything else."""
    try:
        state = ServingState.from_dict(json.loads(raw.decode("utf-8")))
    except (UnicodeDecodeError, TypeError, KeyError, RecursionError) as exc:
        raise ValueError(f"not a UTF-8 JSON state record: {str(exc)[:120]}") from exc
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(str(exc)[:200] or "empty file") from exc
    if state.model_name != model_name:
        raise ValueError(f"it describes model {state.model_name!r}")
    return replace(state, model_name=model_name)  # the name the file was found by: checked at the edge


def _readable(path: Path, model_name: str) -> ServingState | None:
    try:
        return _parse(path.read_bytes(), model_name)
    except (OSError, ValueError):
        return None


def summarize_log(previous: dict[str, Any] | None, lines: list[bytes], first: int) -> dict[str, Any]:
    """The ``state`` part of a state-log snapshot (:func:`seqcls.serving.statelog.rotate`): the last recorded
    state and what a later recovery may keep of the history (:func:`~seqcls.serving.statelog.retained`; twice
    the bounded history's length), from the previous snapshot's part and the lines since."""
    prev = previous or {}
    at = Path("the state log being rotated")
    entries, last = fold_states(at, lines, first, prev.get("history") or [], prev.get("last"), HistoryEntry.from_dict)
    live = {last.get(k) for k in ("serving", "previous", "candidate")} if isinstance(last, dict) else set()
    return {"last": last, "history": retained(entries, 2 * HISTORY_LIMIT, _SERVING_ACTIONS, live - {None})}


def _logged(path: Path, lines: list[bytes], first: int, part: dict[str, Any], model_name: str) -> ServingState | None:
    """The state ``lines`` leave after a snapshot's ``part`` (ValueError/TypeError/AttributeError when wrong)."""
    entries, last = fold_states(path, lines, first, part.get("history") or [], part.get("last"), HistoryEntry.from_dict)
    if last is None:
        return None
    state = replace(ServingState.from_dict({**last, "model_name": model_name, "history": []}), model_name=model_name)
    return replace(state, history=bounded_history([HistoryEntry.from_dict(e) for e in entries], state.live_versions()))


def read_log(repository: Path, model_name: str) -> ServingState | None:
    """The newest state the append-only log records (its full history, bounded), None when it has none: read
    from the newest snapshot of the log (:func:`summarize_log`) and the lines after it, so its cost does not grow
    with the releases behind it — the same state a read of the whole log gives."""
    path = log_path(repository, model_name)
    try:
        (chunk,) = read_tail(path).chunks
    except OSError:
        return None
    part = (chunk.snapshot or {}).get("parts", {}).get("state") or {}
    try:
        return _logged(path, chunk.lines, chunk.first, part, model_name)
    except (ValueError, TypeError, AttributeError) as exc:
        if not part:  # the whole log was read: its last state is unreadable
            return None
        log.warning("%s: its newest snapshot's state is unusable (%s): reading the whole log", path, exc)
    try:
        return _logged(path, read_lines(path), 1, {}, model_name)
    except (ValueError, TypeError, AttributeError):
        return None


def recovered_state(repository: Path, model_name: str) -> ServingState | None:
    """The newest readable copy of a damaged state file: its ``.bak`` or the log's last record."""
    path = state_path(repository, model_name)
    copies = [s for s in (_readable(backup_path(path), model_name), read_log(repository, model_name)) if s]
    return max(copies, key=lambda s: s.generation) if copies else None


def read_state(repository: Path, model_name: str) -> ServingState:
    """The recorded state of ``model_name`` (an empty one, generation 0, when none was ever written).

    A damaged file (binary garbage, wrong JSON, wrong schema) is a ServingError naming it, so no
    writer ever writes over it blindly; readers use :func:`current_state` (which falls back to a copy).
    """
    path = state_path(repository, model_name)
    try:
        return _parse(path.read_bytes(), model_name)
    except FileNotFoundError:
        return ServingState.empty(model_name)
    except OSError as exc:
        raise ServingError(f"{path}: cannot read the recorded serving state: {exc}") from exc
    except ValueError as exc:
        raise _corrupt(path, model_name, str(exc)) from exc


def state_damaged(repository: Path, model_name: str) -> str | None:
    """Why the state file is unreadable (read_state then uses a copy), None when it reads (or is absent)."""
    path = state_path(repository, model_name)
    try:
        _parse(path.read_bytes(), model_name)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return str(exc)
    return None


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """A short exclusive flock around one compare-and-replace (see seqcls.serving.lease on NFS)."""
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_state(repository: Path, state: ServingState, *, expected_generation: int) -> ServingState:
    """Atomically record ``state`` if the file is still at ``expected_generation``; returns what was written.

    Refuses (ServingError) when someone else wrote in between: re-read, re-derive, retry.
    """
    repository = Path(repository)
    path = state_path(repository, state.model_name)
    repository.mkdir(parents=True, exist_ok=True)
    with _file_lock(repository / f"{STATE_PREFIX}{state.model_name}.lock"):
        current_raw = path.read_bytes() if path.is_file() else None
        current = read_state(repository, state.model_name)
        if current.generation != expected_generation:
            last = current.history[-1] if current.history else None
            who = f" by {last.by} at {last.at} ({last.action} of version {last.version})" if last else ""
            raise ServingError(
                f"{path}: recorded serving state of {state.model_name!r} changed underneath this writer: it is at "
                f"generation {current.generation}{who}, this change was derived from generation "
                f"{expected_generation}. Nothing was written; re-read the state and retry."
            )
        written = replace(state, generation=expected_generation + 1, updated_at=now_iso())
        if current_raw is not None:
            atomic_write(backup_path(path), current_raw)
        atomic_write(path, json.dumps(written.to_dict(), indent=2) + "\n")
        _append_log(repository, written, current)
    log.info(
        "recorded serving state of %s: serving %s, previous %s, candidate %s (generation %d)",
        written.model_name,
        written.serving,
        written.previous,
        written.candidate,
        written.generation,
    )
    return replace(written, appended=0)


def _log_record(written: ServingState, before: ServingState | None, new: list[HistoryEntry]) -> dict[str, Any]:
    fields = {k: v for k, v in written.to_dict().items() if k not in ("history", "schema", "model_name")}
    record = {"generation": written.generation, "at": written.updated_at, "state": fields}
    record["entries"] = [e.to_dict() for e in new]
    if before is not None:
        record["before"] = {"serving": before.serving, "previous": before.previous, "candidate": before.candidate}
    record["who"] = actor()
    return record


def _append_log(repository: Path, written: ServingState, before: ServingState | None) -> None:
    """One line per recorded change, after the state is written (the log holds only recorded states).
    The state is recorded either way: a missing log line costs only old history."""
    new = written.history[len(written.history) - min(written.appended, len(written.history)) :]
    append_line(log_path(repository, written.model_name), _log_record(written, before, new))


def infer_legacy_state(repository: Path, model_name: str) -> ServingState:
    """The state a repository without a state file implies, from its ``config.pbtxt`` policies.

    The ensemble's ``version_policy`` names the served version; any other version the composing
    models keep live is the warm previous one. Returned with generation 0 and an "adopt" entry,
    for the caller to record with ``write_state(..., expected_generation=0)``. A repository written
    before state files (the default model's classic names), and any model whose state file was
    lost, are read the same way: what its configs serve keeps being served.
    """
    names = model_name.names
    repo = Repository(Path(repository), Path(repository), names)
    serving = repo.serving_version()
    if serving is None:
        return ServingState.empty(model_name)
    others = sorted({v for m in names.composing for v in repo.live_versions(m)} - {serving})
    below = [v for v in others if v < serving]
    previous = below[-1] if below else (others[-1] if others else None)
    info = repo.release_info(serving) or {}
    fingerprint = info.get("fingerprint") if isinstance(info.get("fingerprint"), str) else None
    history = []
    if previous is not None:
        prev_info = repo.release_info(previous) or {}
        prev_fp = prev_info.get("fingerprint") if isinstance(prev_info.get("fingerprint"), str) else None
        history.append(HistoryEntry(previous, prev_fp, "adopt", now_iso(), "legacy", "previous, from config.pbtxt"))
    history.append(
        HistoryEntry(serving, fingerprint, "adopt", now_iso(), "legacy", "adopted from the repository's config.pbtxt")
    )
    state = ServingState(model_name=model_name, serving=serving, previous=previous, history=history)
    return replace(state, published=max(state.known_versions()), appended=len(history))


def restore_state(repository: Path, model_name: str) -> ServingState | None:
    """Record the newest readable copy over a damaged state file (the damaged bytes are kept as
    ``<file>.damaged``); None when the file is not damaged. Call only after the copy was applied."""
    path = state_path(repository, model_name)
    with _file_lock(Path(repository) / f"{STATE_PREFIX}{model_name}.lock"):
        why = state_damaged(repository, model_name)
        copy = recovered_state(repository, model_name) if why else None
        if copy is None:
            return None
        atomic_write(path.with_name(path.name + ".damaged"), path.read_bytes())
        written = replace(copy, updated_at=now_iso())
        atomic_write(path, json.dumps(written.to_dict(), indent=2) + "\n")
        record = _log_record(written, None, [])
        note = f"state file was unreadable ({why[:200]}): recorded its newest readable copy"
        record.update(event="repair", note=note)
        append_line(log_path(Path(repository), model_name), record)
    log.warning("%s was unreadable (%s): recorded its newest readable copy, %s", path, why, copy.describe())
    return written


def current_state(repository: Path, model_name: str) -> ServingState:
    """What ``model_name`` should serve: the recorded state; for a damaged file its newest readable copy
    (.bak or log, with a warning); for a missing one what the log or the repository's configs imply."""
    path = state_path(repository, model_name)
    why = state_damaged(repository, model_name)
    if why:
        copy = recovered_state(repository, model_name)
        if copy is None:
            raise _corrupt(path, model_name, why)
        log.warning("%s is unreadable (%s): using its newest readable copy, %s", path, why, copy.describe())
        return copy
    state = read_state(repository, model_name)
    if state.generation == 0 and not path.exists():
        return reconstructed_state(repository, model_name)
    return state


def reconstructed_state(repository: Path, model_name: str) -> ServingState:
    """For a missing state file: the log's last record, else what the configs serve (generation 0 either
    way, so the first writer records it with ``expected_generation=0``)."""
    logged = read_log(repository, model_name)
    if logged is not None:
        return replace(logged, generation=0)
    return infer_legacy_state(repository, model_name)


__all__ = [
    "ACTIONS",
    "EVENTS",
    "HISTORY_LIMIT",
    "HistoryEntry",
    "ServingState",
    "actor",
    "append_event",
    "backup_path",
    "bounded_history",
    "current_state",
    "infer_legacy_state",
    "log_path",
    "read_log",
    "read_state",
    "reconstructed_state",
    "recovered_state",
    "restore_state",
    "state_damaged",
    "state_path",
    "summarize_log",
    "write_state",
]
