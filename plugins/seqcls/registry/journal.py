"""The registry journal: every MLflow change a release attempt makes, written down before it is made.

A release that dies (``kill -9``, a lost worker, SIGKILL after Airflow's SIGTERM grace) between
creating a model version and recording it in its workspace would leave a version and a moved
``candidate`` alias that nothing knows to undo. So before each change — the registered model
created, a model version created, an alias moved — :func:`record` appends a line saying what it
is and how to undo it to ``<home>/registry-journal/<model>.jsonl`` (fsynced, under a file lock),
beside the attempt that makes it (owner, host, pid, Airflow run, workspace). An attempt is
*ended* when it completed (its version is served: kept) or was undone.

:func:`undo_dead_attempts` undoes the changes of the attempts not ended whose process is gone
(same host) or whose release lease is no longer held live — the next release of the model calls
it before registering, ``seqcls sync`` calls it too. Undo is idempotent (each change is reverted
only while it is still in effect), never moves ``champion`` and never deletes a version that ever
was champion or that the recorded state serves. MLflow down: ``{"error": ...}`` and the journal is
kept for next time. An attempt is per process (CLI) or per DAG run (Airflow: its tasks are
separate processes, so only the run's lease tells whether it is alive).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls.contract.names import ModelName, require_name
from seqcls.errors import LeaseError, SeqclsError
from seqcls.files import atomic_write, held
from seqcls.registry.ledger import CHAMPION, aliased_version, client, history, version_exists
from seqcls.release.keys import served_release_key
from seqcls.serving.lease import ReleaseLease
from seqcls.serving.pids import pid_alive, pid_start
from seqcls.serving.repository import Repository
from seqcls.serving.state import current_state
from seqcls.settings import Settings

log = logging.getLogger(__name__)

JOURNAL_DIR = "registry-journal"
KINDS = ("process", "run")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _pid_start() -> float | None:
    return pid_start(os.getpid())


@dataclass(frozen=True)
class Attempt:
    """Who makes the registry changes: one CLI release process, or one Airflow DAG run (kind ``run``)."""

    id: str
    model_name: str
    owner: str  # the release lease owner (seqcls.release.control.release_owner)
    kind: str = "process"
    run: str | None = None
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    pid_start: float | None = field(default_factory=_pid_start)
    workspace: str = ""
    fingerprint: str = ""
    release_key: str = ""
    started: str = field(default_factory=_now)

    @classmethod
    def new(cls, model_name: str, owner: str, *, kind: str = "process", run: str | None = None, **kw: Any) -> Attempt:
        if kind not in KINDS:
            raise ValueError(f"attempt kind {kind!r} is not one of {', '.join(KINDS)}")
        here = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        ident = f"run:{run}" if kind == "run" else f"process:{here}"
        return cls(id=ident, model_name=model_name, owner=owner, kind=kind, run=run, **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Attempt:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


_ATTEMPT: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar("seqcls_registry_attempt", default=None)


@contextlib.contextmanager
def attempt_scope(attempt: Attempt) -> Iterator[Attempt]:
    """Registry changes made in the block are journalled as ``attempt``'s."""
    token = _ATTEMPT.set(attempt)
    try:
        yield attempt
    finally:
        _ATTEMPT.reset(token)


def current_attempt() -> Attempt | None:
    return _ATTEMPT.get()


@contextlib.contextmanager
def standalone(settings: Settings, model_name: str, owner: str, workspace: str) -> Iterator[Attempt]:
    """The current attempt, else one for the block (a step run alone): ended when the block succeeds,
    undone when it fails — and by :func:`undo_dead_attempts` when its process dies in it."""
    mine = current_attempt()
    if mine is not None:
        yield mine
        return
    attempt = Attempt.new(model_name, owner, workspace=workspace)
    with attempt_scope(attempt):
        try:
            yield attempt
        except BaseException:
            try:
                undo_attempt(settings, model_name, attempt.id, reason="the step failed")
            except Exception as exc:  # MLflow down: the next release or sync undoes it
                log.error("registry journal: attempt %s not undone (%s); kept for next time", attempt.id, exc)
            raise
    end(settings, model_name, attempt.id, "completed")


def journal_path(settings: Settings, model: ModelName) -> Path:
    """Beside the release workspaces (shared by every worker of an Airflow deployment), one file per model."""
    return Path(settings.home) / JOURNAL_DIR / f"{require_name(model)}.jsonl"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with held(path.with_name(path.name + ".lock"), timeout=60, what="registry journal", error=SeqclsError):
        yield


def _append(path: Path, entry: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(entry, ensure_ascii=False, sort_keys=True) + "\n"
    with _locked(path), open(path, "a+b") as fh:
        if fh.tell() and (fh.seek(fh.tell() - 1), fh.read(1))[1] != b"\n":
            line = "\n" + line  # after a torn line (a kill mid-write): never glue an entry onto it
        fh.write(line.encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())


def read(path: Path) -> list[dict[str, Any]]:
    """Every entry (a torn last line, from a kill mid-write, is skipped: its change was never made)."""
    try:
        raw = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    entries = []
    for n, line in enumerate(raw.splitlines(), 1):
        try:
            entry = json.loads(line)
        except ValueError:
            log.warning("%s line %d: not a journal entry (torn write?) — skipped", path, n)
            continue
        if isinstance(entry, dict) and entry.get("attempt"):
            entries.append(entry)
    return entries


def record(settings: Settings, model_name: str, change: str, **fields: Any) -> None:
    """Journal ``change`` (``registered_model`` | ``version`` | ``created`` | ``alias``) of the current attempt.

    Call it BEFORE making the change (``created`` after: it only adds the version number); outside
    any attempt (:func:`attempt_scope`) nothing is journalled.
    """
    attempt = current_attempt()
    if attempt is None or attempt.model_name != model_name:
        return
    path = journal_path(settings, model_name)
    if not any(e.get("event") == "begin" and e["attempt"] == attempt.id for e in read(path)):
        _append(path, {"event": "begin", "attempt": attempt.id, "who": asdict(attempt), "at": _now()})
    _append(path, {"event": "change", "attempt": attempt.id, "change": change, "at": _now(), **fields})


def end(settings: Settings, model_name: str, attempt_id: str, outcome: str) -> None:
    """The attempt is over (``completed``: its changes stay; ``undone``); compacts a journal with nothing open."""
    path = journal_path(settings, model_name)
    entries = read(path)
    if not any(e["attempt"] == attempt_id for e in entries):
        return
    _append(path, {"event": "end", "attempt": attempt_id, "outcome": outcome, "at": _now()})
    with _locked(path):
        if not open_attempts(read(path)):
            atomic_write(path, "")


def open_attempts(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{attempt id: {"who": Attempt, "changes": [...]}}`` for every attempt not ended."""
    out: dict[str, dict[str, Any]] = {}
    for e in entries:
        aid = e["attempt"]
        if e.get("event") == "begin":
            out[aid] = {"who": Attempt.from_dict(e.get("who") or {}), "changes": []}
        elif e.get("event") == "change" and aid in out:
            out[aid]["changes"].append(e)
        elif e.get("event") == "end":
            out.pop(aid, None)
    return out


def _versions_of(c, change: dict[str, Any], created: dict[str, int]) -> list[int]:
    """The versions a ``version`` change made: its ``created`` number, else those of its run with its key."""
    if change.get("run_id") in created:
        return [created[change["run_id"]]]
    if not change.get("run_id"):
        return []
    found = c.search_model_versions(f"name = '{change['model']}' and run_id = '{change['run_id']}'")
    key = change.get("release_key")
    return [int(v.version) for v in found if not key or v.tags.get("release_key") == key]


def undo_changes(settings: Settings, model_name: str, changes: list[dict[str, Any]], reason: str) -> list[str]:
    """Revert ``changes`` (newest first) while each is still in effect; never champion. MLflow errors raise.

    An attempt whose version is what the recorded state serves (it died inside expose) is kept whole.
    """
    c = client(settings)
    created = {ch["run_id"]: int(ch["version"]) for ch in changes if ch["change"] == "created" and ch.get("run_id")}
    made = {v for ch in changes if ch["change"] == "version" for v in _versions_of(c, ch, created)}
    made = {v for v in made if version_exists(c, model_name, v)}
    served = _served(settings, model_name) if made else None
    for version in sorted(made):
        tags = c.get_model_version(model_name, str(version)).tags
        if served and (tags.get("fingerprint"), tags.get("release_key")) == served:
            return [f"kept: version {version} is what the recorded state serves"]
    champions = {h.get("champion") for h in history(c, model_name)} if made else set()
    actions: list[str] = []
    for ch in reversed(changes):
        if ch["change"] == "alias":
            actions += _undo_alias(c, model_name, ch)
        elif ch["change"] == "version":
            for version in sorted(made & set(_versions_of(c, ch, created)) - champions):
                current = aliased_version(c, model_name, CHAMPION)
                if current is None or int(current.version) != version:  # champion: never ours to undo
                    c.delete_model_version(model_name, str(version))
                    actions.append(f"version {version} deleted (created by this attempt)")
            if ch.get("run_id"):
                with contextlib.suppress(Exception):  # the run is audit trail only
                    c.set_tag(ch["run_id"], "seqcls.outcome", "rolled_back")
                    c.set_tag(ch["run_id"], "seqcls.rollback_reason", reason[:500])
        elif ch["change"] == "registered_model":
            with contextlib.suppress(Exception):  # already gone, or it has versions: keep
                if not c.search_model_versions(f"name = '{model_name}'"):
                    c.delete_registered_model(model_name)
                    actions.append(f"registered model {model_name} deleted (created by this attempt)")
    return actions


def _undo_alias(c, model_name: str, ch: dict[str, Any]) -> list[str]:
    current = aliased_version(c, model_name, ch["alias"])
    if ch["alias"] == CHAMPION or current is None or int(current.version) != int(ch["target"]):
        return []  # moved on since (or never moved): not ours any more
    previous = ch.get("previous")
    if previous is not None and version_exists(c, model_name, int(previous)):
        c.set_registered_model_alias(model_name, ch["alias"], str(previous))
        return [f"{ch['alias']} back to version {previous}"]
    c.delete_registered_model_alias(model_name, ch["alias"])
    return [f"{ch['alias']} removed"]


def _served(settings: Settings, model: str) -> tuple[str | None, str | None] | None:
    """(fingerprint, release key) of what the recorded state serves; None when nothing, or the state cannot
    be read (then nothing is protected by it — champion and history still are)."""
    try:
        repo = Repository.from_settings(settings, model)
        state = current_state(repo.root, model)
        if state.serving is None:
            return None
        return state.fingerprint_of(state.serving), served_release_key(repo, state.serving)
    except Exception as exc:
        log.warning("registry journal: cannot read the serving state of %s (%s)", model, exc)
        return None


def undo_attempt(settings: Settings, model_name: str, attempt_id: str, *, reason: str = "") -> dict[str, Any]:
    """Undo what attempt ``attempt_id`` journalled and end it (nothing journalled: no change). MLflow errors raise."""
    path = journal_path(settings, model_name)
    found = open_attempts(read(path)).get(attempt_id)
    if found is None:
        return {"changed": False, "actions": []}
    actions = undo_changes(settings, model_name, found["changes"], reason)
    end(settings, model_name, attempt_id, "undone")
    if actions:
        log.info("registry journal: attempt %s of %s undone — %s", attempt_id, model_name, "; ".join(actions))
    return {"changed": bool(actions), "actions": actions}


def dead_reason(settings: Settings, attempt: Attempt, model: ModelName) -> str | None:
    """Why ``attempt`` (an attempt of ``model``, read from its journal) is over without having ended
    (None while it may still be running)."""
    mine = current_attempt()
    if mine is not None and mine.id == attempt.id:
        return None
    if attempt.kind == "process" and attempt.host == socket.gethostname():
        if attempt.pid != os.getpid() and not pid_alive(attempt.pid, attempt.pid_start):
            return f"its process {attempt.pid} on {attempt.host} is gone"
        if attempt.pid == os.getpid():
            return None
    lease = ReleaseLease(Path(str(settings.triton_repository)), model)
    try:
        holder = lease.holder()
    except LeaseError:
        return None  # unreadable lease: cannot tell, keep the journal for next time
    if holder is not None and holder.owner == attempt.owner and lease.dead_reason(holder) is None:
        where = (holder.host, holder.pid) == (attempt.host, attempt.pid)
        if holder.run == attempt.run if attempt.kind == "run" else where:
            return None
    if attempt.kind == "process" and attempt.host == socket.gethostname():
        return None  # alive on this host, before or after holding the lease
    return f"its release lease ({attempt.owner}, run {attempt.run or '-'}) is not held live"


def undo_dead_attempts(settings: Settings, model_name: ModelName, *, reason: str = "") -> dict[str, Any]:
    """Undo the registry changes of ``model_name``'s dead attempts (see the module doc).

    Returns ``{"undone": {attempt: actions}, "open": [attempts still alive]}``, or ``{"error": ...}``
    (MLflow down, a journal that cannot be read) — the journal is kept for the next call.
    """
    path = journal_path(settings, model_name)
    try:
        attempts = open_attempts(read(path))
        undone: dict[str, list[str]] = {}
        alive: list[str] = []
        for aid, found in attempts.items():
            why = dead_reason(settings, found["who"], model_name)
            if why is None:
                alive.append(aid)
                continue
            log.warning("registry journal: attempt %s of %s is dead (%s) — undoing its changes", aid, model_name, why)
            actions = undo_changes(settings, model_name, found["changes"], reason or f"dead attempt: {why}")
            end(settings, model_name, aid, "undone")
            undone[aid] = actions
    except Exception as exc:
        log.error("registry journal %s: dead attempts not undone (%s); kept for next time", path, exc)
        return {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    return {"undone": undone, "open": alive}


__all__ = [
    "Attempt",
    "attempt_scope",
    "current_attempt",
    "dead_reason",
    "end",
    "journal_path",
    "open_attempts",
    "read",
    "record",
    "standalone",
    "undo_attempt",
    "undo_changes",
    "undo_dead_attempts",
]
