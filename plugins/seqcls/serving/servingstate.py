"""The recorded serving state as a value: what one model SHOULD serve, and its pure transitions.

Why a module of its own: the state is kept on a POSIX repository (:mod:`seqcls.serving.state`) or on an
object store (:mod:`seqcls.serving.s3state`), and the POSIX side hands over to the store side when its
repository is a store's working copy; both need the value, neither may import the other's disk code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from seqcls.contract.names import ModelName, require_name
from seqcls.errors import ServingError
from seqcls.serving.statelog import now_iso

SCHEMA = 1
HISTORY_LIMIT = 50
ACTIONS = ("release", "rollback", "candidate", "abandon", "adopt")
#: Actions after which ``version`` is what the public ensemble serves.
SERVING_ACTIONS = ("release", "rollback", "adopt")


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
            if entry.action in SERVING_ACTIONS:
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
    noise = [i for i in unpinned if history[i].action not in SERVING_ACTIONS]
    served = [i for i in unpinned if history[i].action in SERVING_ACTIONS]
    drop = set((noise + served)[:excess])
    return [e for i, e in enumerate(history) if i not in drop]


__all__ = ["ACTIONS", "HISTORY_LIMIT", "SCHEMA", "SERVING_ACTIONS", "HistoryEntry", "ServingState", "bounded_history"]
