"""The append-only log beside each recorded serving state: one JSON line per change, never rewritten.

:func:`seqcls.serving.state.write_state` appends a line for every state it records; the gates and
promote append *events* that change no state (:func:`append_event`). ``seqcls history``
(:mod:`seqcls.ops.history`) reads it back. Each line is one ``O_APPEND`` write, so concurrent writers
never interleave a line, and a line that cannot be written is a warning, never an error.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import logging
import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls.contract.names import ModelName, require_name
from seqcls.settings import airflow_task_context

log = logging.getLogger(__name__)

STATE_PREFIX = ".seqcls-state."


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def log_path(repository: Path, model: ModelName) -> Path:
    """The append-only log of every recorded change, one JSON line each (a plain file, like the state).

    A state line: ``{"generation", "at", "state", "entries", "before", "who"}`` — the state written,
    the history entries it added, what it replaced (serving/previous/candidate) and who wrote it
    (:func:`actor`; lines written before ``before``/``who`` existed lack them). An event line changes
    no state: ``{"event": "refused"|"promote"|"repair", "at", "who", ...}`` (:func:`append_event`).
    """
    return Path(repository) / f"{STATE_PREFIX}{require_name(model)}.log.jsonl"


#: Event lines of the log (see :func:`log_path`); ``repair`` also carries the state it recorded; ``override``:
#: a gate's refusal overridden by an operator (who, why, the verdict overridden); ``damaged``: a release went on
#: beside a served version damaged beyond restoring (which version, what is wrong).
EVENTS = ("refused", "override", "promote", "repair", "damaged")


def actor() -> dict[str, Any]:
    """Who is changing something: user, host, pid, and the Airflow dag/run/try when run by a task."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (a container's arbitrary uid)
        user = str(os.getuid())
    who: dict[str, Any] = {"user": user, "host": socket.gethostname(), "pid": os.getpid()}
    who.update(airflow_task_context())
    return who


def append_line(path: Path, record: dict[str, Any]) -> bool:
    """Append one JSON line with a single O_APPEND write, under an exclusive ``flock`` of the log itself
    (concurrent writers never interleave a line); after a torn last line (a writer killed mid-write) the
    record starts a line of its own instead of being glued onto it and lost with it. False (with a
    warning) when it could not be written."""
    data = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode("utf-8")
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            os.write(fd, data)
        finally:
            os.close(fd)  # releases the lock
    except OSError as exc:
        log.warning("%s: could not append to the state log: %s", path, exc)
        return False
    return True


def append_event(repository: Path, model_name: str, event: str, **fields: Any) -> bool:
    """Record an event that changes no state (a gate's refusal, a champion move) in ``model_name``'s log.

    Never raises: the log is the audit trail, and failing to write it must not turn what happened
    (a refusal, a promotion) into another error. Returns whether the line was written.
    """
    try:
        if event not in EVENTS:
            raise ValueError(f"event {event!r} is not one of {', '.join(EVENTS)}")
        record = {"event": event, "at": now_iso(), "who": actor(), **fields}
        Path(repository).mkdir(parents=True, exist_ok=True)
        return append_line(log_path(Path(repository), model_name), record)
    except Exception as exc:
        log.warning("%s: %s event not recorded in the state log: %s", model_name, event, exc)
        return False


__all__ = ["EVENTS", "STATE_PREFIX", "actor", "append_event", "append_line", "log_path", "now_iso"]
