"""The append-only log beside each recorded serving state: one JSON line per change, never rewritten.

:func:`seqcls.serving.state.write_state` appends a line for every state it records; the gates and
promote append *events* that change no state (:func:`append_event`). ``seqcls history``
(:mod:`seqcls.ops.history`) reads it back. Each line is one ``O_APPEND`` write, so concurrent writers
never interleave a line, and a line that cannot be written is a warning, never an error.

A log larger than :data:`ROTATE_BYTES` is rotated by ``seqcls gc`` (:func:`rotate`): the whole file renamed,
under its lock, to the next segment ``<log>.<n>`` (never a line cut; a torn last line stays the segment's last)
and then compressed to ``<log>.<n>.gz``. Segments are kept: every reader (:func:`read_lines`) reads them, oldest
first, then the live file, so the recorded state recovered from the log and ``history`` are what they were.
"""

from __future__ import annotations

import fcntl
import getpass
import gzip
import json
import logging
import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls import faults
from seqcls.contract.names import ModelName, require_name
from seqcls.files import atomic_write, replace_file
from seqcls.settings import airflow_task_context

log = logging.getLogger(__name__)

STATE_PREFIX = ".seqcls-state."
#: A state log larger than this is rotated into a compressed segment by ``seqcls gc`` (about 150 releases).
ROTATE_BYTES = 256_000


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
        for _ in range(10):  # the log rotated while this waited for its lock: open the new one
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if not _same_file(fd, path):
                    continue
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    data = b"\n" + data
                os.write(fd, data)
                return True
            finally:
                os.close(fd)  # releases the lock
        raise OSError(f"{path} kept being replaced")
    except OSError as exc:
        log.warning("%s: could not append to the state log: %s", path, exc)
        return False


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _segment_number(log_file: Path, p: Path) -> tuple[int, bool] | None:
    """``<log>.<n>`` / ``<log>.<n>.gz`` → (n, compressed); None for any other name."""
    rest = p.name[len(log_file.name) + 1 :] if p.name.startswith(log_file.name + ".") else ""
    number, _, ext = rest.partition(".")
    return (int(number), ext == "gz") if number.isdigit() and ext in ("", "gz") else None


def segments(path: Path) -> list[Path]:
    """The rotated segments of the log ``path``, oldest first (a compressed one preferred to its plain twin)."""
    found: dict[int, Path] = {}
    for p in path.parent.glob(f"{path.name}.*"):
        seg = _segment_number(path, p)
        if seg is not None and (seg[1] or seg[0] not in found):
            found[seg[0]] = p
    return [found[n] for n in sorted(found)]


def read_lines(path: Path) -> list[bytes]:
    """Every line of the log: its segments, oldest first, then the live file (FileNotFoundError: no log at all).
    An unreadable segment is a warning (its lines are missing), never an error."""
    parts = segments(path)
    lines: list[bytes] = []
    for seg in parts:
        try:
            data = seg.read_bytes()
            lines += (gzip.decompress(data) if seg.name.endswith(".gz") else data).splitlines()
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            log.warning("%s: unreadable segment of the state log, skipped: %s", seg, exc)
    try:
        lines += path.read_bytes().splitlines()
    except FileNotFoundError:
        if not parts:
            raise
    return lines


def _compress(plain: Path) -> Path:
    gz = plain.with_name(plain.name + ".gz")
    atomic_write(gz, gzip.compress(plain.read_bytes(), mtime=0))
    plain.unlink()
    return gz


def rotate(path: Path, max_bytes: int | None = None) -> Path | None:
    """When the log ``path`` is larger than ``max_bytes`` (default :data:`ROTATE_BYTES`): rename it whole, under
    its lock, to the next segment and compress that; returns the segment (None: left alone). A rotation killed
    before compressing leaves a plain segment every reader reads; the next rotation compresses it."""
    limit = ROTATE_BYTES if max_bytes is None else max_bytes
    for seg in segments(path):
        if not seg.name.endswith(".gz"):
            _compress(seg)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not _same_file(fd, path) or os.fstat(fd).st_size < limit:
            return None
        number = max((_segment_number(path, seg)[0] for seg in segments(path)), default=0) + 1
        plain = path.with_name(f"{path.name}.{number:06d}")
        replace_file(path, plain)  # appenders waiting for the lock open the new log (append_line)
        faults.point("statelog:rotated")
    finally:
        os.close(fd)
    log.info("state log %s rotated into %s.gz", path, plain.name)
    return _compress(plain)


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


__all__ = [
    "EVENTS",
    "ROTATE_BYTES",
    "STATE_PREFIX",
    "actor",
    "append_event",
    "append_line",
    "log_path",
    "now_iso",
    "read_lines",
    "rotate",
    "segments",
]
