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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls.errors import ServingError
from seqcls.files import atomic_write
from seqcls.serving.names import CLASSIC
from seqcls.serving.repository import Repository
from seqcls.settings import validate_model_name

log = logging.getLogger(__name__)

SCHEMA = 1
HISTORY_LIMIT = 50
ACTIONS = ("release", "rollback", "candidate", "abandon", "adopt")
#: Actions after which ``version`` is what the public ensemble serves.
_SERVING_ACTIONS = ("release", "rollback", "adopt")
STATE_PREFIX = ".seqcls-state."


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def state_path(repository: Path, model_name: str) -> Path:
    """Where ``model_name``'s state lives: a dot file at the repository root (Triton ignores files)."""
    return Path(repository) / f"{STATE_PREFIX}{validate_model_name(model_name)}.json"


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

    model_name: str
    serving: int | None = None
    previous: int | None = None
    candidate: int | None = None
    history: list[HistoryEntry] = field(default_factory=list)
    generation: int = 0
    updated_at: str = ""

    @classmethod
    def empty(cls, model_name: str) -> ServingState:
        return cls(model_name=validate_model_name(model_name))

    def live_versions(self) -> list[int]:
        """Versions the composing models must have loaded (serving, previous, candidate)."""
        return sorted({v for v in (self.serving, self.previous, self.candidate) if v is not None})

    def fingerprint_of(self, version: int | None) -> str | None:
        """The newest fingerprint the history records for ``version``."""
        for entry in reversed(self.history):
            if entry.version == version and entry.fingerprint:
                return entry.fingerprint
        return None

    # ------------------------------------------------------------------ transitions (no I/O)

    def _with(self, entry: HistoryEntry, **changes: Any) -> ServingState:
        history = [*self.history, entry][-HISTORY_LIMIT:]
        return replace(self, history=history, **changes)

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
        return cls(
            model_name=str(_text(d["model_name"], "model_name")),
            serving=_version(d["serving"], "serving"),
            previous=_version(d["previous"], "previous"),
            candidate=_version(d["candidate"], "candidate"),
            history=[HistoryEntry.from_dict(e) for e in history],
            generation=generation,
            updated_at=str(_text(d.get("updated_at", ""), "updated_at")),
        )


# ---------------------------------------------------------------------------- disk


def _corrupt(path: Path, model_name: str, what: str) -> ServingError:
    bak = backup_path(path)
    restore = f"restore it from {bak} (the previous good copy)" if bak.is_file() else f"no {bak.name} exists"
    return ServingError(
        f"{path}: the recorded serving state of {model_name!r} is unreadable ({what}). Nothing was changed. "
        f"Check `seqcls status --model-name {model_name}`, then either {restore}, or delete {path.name} — "
        f"seqcls then adopts what the repository's config.pbtxt files serve — and run "
        f"`seqcls sync --model-name {model_name}` after that."
    )


def read_state(repository: Path, model_name: str) -> ServingState:
    """The recorded state of ``model_name`` (an empty one, generation 0, when none was ever written)."""
    path = state_path(repository, model_name)
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ServingState.empty(model_name)
    except OSError as exc:
        raise ServingError(f"{path}: cannot read the recorded serving state: {exc}") from exc
    try:
        state = ServingState.from_dict(json.loads(raw))
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise _corrupt(path, model_name, str(exc) or "empty file") from exc
    if state.model_name != model_name:
        raise _corrupt(path, model_name, f"it describes model {state.model_name!r}")
    return state


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
        current_raw = path.read_text(encoding="utf-8") if path.is_file() else None
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
    log.info(
        "recorded serving state of %s: serving %s, previous %s, candidate %s (generation %d)",
        written.model_name,
        written.serving,
        written.previous,
        written.candidate,
        written.generation,
    )
    return written


def infer_legacy_state(repository: Path, model_name: str) -> ServingState:
    """The state a repository written before state files implies, from its ``config.pbtxt`` policies.

    The ensemble's ``version_policy`` names the served version; any other version the composing
    models keep live is the warm previous one. Returned with generation 0 and an "adopt" entry,
    for the caller to record with ``write_state(..., expected_generation=0)``. Only the default
    model (the classic names) has such a past: any other model without a state file never served.
    """
    validate_model_name(model_name)
    if model_name != CLASSIC.model_name:
        return ServingState.empty(model_name)
    repo = Repository(Path(repository), Path(repository), CLASSIC)
    serving = repo.serving_version()
    if serving is None:
        return ServingState.empty(model_name)
    others = sorted({v for m in CLASSIC.composing for v in repo.live_versions(m)} - {serving})
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
    return ServingState(model_name=model_name, serving=serving, previous=previous, history=history)


def current_state(repository: Path, model_name: str) -> ServingState:
    """The recorded state, or — for a repository that never had one — what its configs imply."""
    state = read_state(repository, model_name)
    if state.generation == 0 and not state_path(repository, model_name).exists():
        return infer_legacy_state(repository, model_name)
    return state


__all__ = [
    "ACTIONS",
    "HISTORY_LIMIT",
    "HistoryEntry",
    "ServingState",
    "backup_path",
    "current_state",
    "infer_legacy_state",
    "read_state",
    "state_path",
    "write_state",
]
