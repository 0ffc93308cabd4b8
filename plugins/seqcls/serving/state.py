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
from dataclasses import replace
from pathlib import Path
from typing import Any

from seqcls.contract.names import ModelName, require_name
from seqcls.errors import ServingError
from seqcls.files import atomic_write
from seqcls.serving import statelog
from seqcls.serving.repository import Repository
from seqcls.serving.s3state import S3ServingState
from seqcls.serving.servingstate import (
    ACTIONS,
    HISTORY_LIMIT,
    SERVING_ACTIONS,
    HistoryEntry,
    ServingState,
    bounded_history,
)
from seqcls.serving.statelog import (
    EVENTS,
    STATE_PREFIX,
    actor,
    append_line,
    fold_states,
    log_path,
    now_iso,
    read_lines,
    read_tail,
    retained,
)
from seqcls.serving.storeroot import store_at

log = logging.getLogger(__name__)


def state_path(repository: Path, model: ModelName) -> Path:
    """Where ``model``'s state lives: a dot file at the repository root (Triton ignores files)."""
    return Path(repository) / f"{STATE_PREFIX}{require_name(model)}.json"


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


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
    return {"last": last, "history": retained(entries, 2 * HISTORY_LIMIT, SERVING_ACTIONS, live - {None})}


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
    if (store := store_at(repository)) is not None:
        return S3ServingState(store, require_name(model_name)).read().state
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
    if (store := store_at(repository)) is not None:
        return _write_on_store(S3ServingState(store, state.model_name), repository, state, expected_generation)
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


def _write_on_store(side: S3ServingState, repository: Path, state: ServingState, expected: int) -> ServingState:
    """:func:`write_state` on an object store: compare-and-swap on the store (the truth), then this host's copy.

    The copy (state file and log line in the working copy) is what the POSIX readers of this host read —
    ``seqcls history``'s log among them; a host that wrote nothing has no copy, and its readers of the state
    read the store."""
    read = side.read()
    if read.state.generation != expected:
        last = read.state.history[-1] if read.state.history else None
        who = f" by {last.by} at {last.at} ({last.action} of version {last.version})" if last else ""
        raise ServingError(
            f"{side.uri(side.key)}: recorded serving state of {state.model_name!r} changed underneath this writer: "
            f"it is at generation {read.state.generation}{who}, this change was derived from generation "
            f"{expected}. Nothing was written; re-read the state and retry."
        )
    written = side.write(state, read).state
    try:
        repository.mkdir(parents=True, exist_ok=True)
        atomic_write(state_path(repository, state.model_name), json.dumps(written.to_dict(), indent=2) + "\n")
        _append_log(repository, written, read.state)
    except OSError as exc:  # the store holds it: a missing local copy costs only this host's history
        log.warning("%s: state recorded on the store, its local copy not: %s", repository, exc)
    return replace(written, appended=0)


def append_event(repository: Path, model_name: str, event: str, **fields: Any) -> bool:
    """:func:`seqcls.serving.statelog.append_event`, and on a store's working copy the store's event log too.

    Never raises (the audit trail must not turn what happened into another error)."""
    if (store := store_at(repository)) is not None and event in EVENTS:
        try:
            S3ServingState(store, require_name(model_name)).append({"event": event, **fields})
        except Exception as exc:
            log.warning("%s: %s event not recorded on the store: %s", model_name, event, exc)
    return statelog.append_event(repository, model_name, event, **fields)


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
    (.bak or log, with a warning); for a missing one what the log or the repository's configs imply.
    On a store's working copy: the store's state (empty, generation 0, before the first release)."""
    if store_at(repository) is not None:
        return read_state(repository, model_name)
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
