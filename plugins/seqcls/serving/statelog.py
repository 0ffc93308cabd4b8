"""The append-only log beside each recorded serving state: one JSON line per change, never rewritten.

:func:`seqcls.serving.state.write_state` appends a line for every state it records; the gates and
promote append *events* that change no state (:func:`append_event`). ``seqcls history``
(:mod:`seqcls.ops.history`) reads it back. Each line is one ``O_APPEND`` write, so concurrent writers
never interleave a line, and a line that cannot be written is a warning, never an error.

A log larger than :data:`ROTATE_BYTES` (the setting ``statelog_rotate_bytes``) is rotated by ``seqcls gc``
(:func:`rotate`): the whole file renamed, under its lock, to the next segment ``<log>.<n>`` (never a line cut; a
torn last line stays the segment's last) and then compressed to ``<log>.<n>.gz``. Segments are kept, and a full
reader (:func:`read_lines`: ``history`` without a limit, an audit) reads them all. So that the common readers cost
the same after a year of releases as after a week, a rotation also writes a **snapshot** ``<log>.<n>.snap`` of
what the log implies at the cut (:func:`read_tail`): state recovery reads that and the lines after it, ``history
--limit`` the newest segments only. A missing or unreadable snapshot (a rotation without one, a crash) only makes a
reader read further back, as before snapshots.
"""

from __future__ import annotations

import fcntl
import getpass
import gzip
import json
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls import faults
from seqcls.contract.names import ModelName, require_name
from seqcls.files import atomic_write, replace_file
from seqcls.settings import DEFAULT_STATELOG_ROTATE_BYTES, airflow_task_context

log = logging.getLogger(__name__)

STATE_PREFIX = ".seqcls-state."
#: A state log larger than this is rotated into a compressed segment by ``seqcls gc`` (about 150 releases);
#: the setting ``statelog_rotate_bytes`` (``SEQCLS_STATELOG_ROTATE_BYTES``), which gc passes, overrides it.
ROTATE_BYTES = DEFAULT_STATELOG_ROTATE_BYTES
SNAPSHOT_SCHEMA = 1
SNAPSHOT_SUFFIX = ".snap"
#: What a snapshot part is computed by: (the previous snapshot's part or None, the lines since, the first line's
#: number) → the part. Parts are JSON objects; each reader owns one (``state``, ``history``).
Summarizer = Callable[[dict[str, Any] | None, list[bytes], int], dict[str, Any]]


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


def _segment_lines(seg: Path) -> list[bytes]:
    """One segment's lines (OSError/EOFError/BadGzipFile when unreadable)."""
    data = seg.read_bytes()
    return (gzip.decompress(data) if seg.name.endswith(".gz") else data).splitlines()


def read_lines(path: Path) -> list[bytes]:
    """Every line of the log: its segments, oldest first, then the live file (FileNotFoundError: no log at all).
    An unreadable segment is a warning (its lines are missing), never an error. For full-history readers
    (``history`` without a limit, audit); the common readers use :func:`read_tail`."""
    parts = segments(path)
    lines: list[bytes] = []
    for seg in parts:
        try:
            lines += _segment_lines(seg)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            log.warning("%s: unreadable segment of the state log, skipped: %s", seg, exc)
    try:
        lines += path.read_bytes().splitlines()
    except FileNotFoundError:
        if not parts:
            raise
    return lines


def snapshot_path(path: Path, number: int) -> Path:
    """Where the snapshot of the log ``path`` at the end of segment ``number`` lives."""
    return path.with_name(f"{path.name}.{number:06d}{SNAPSHOT_SUFFIX}")


def read_snapshot(path: Path, number: int) -> dict[str, Any] | None:
    """The snapshot at the end of segment ``number``; None when there is none or it is unreadable (a warning:
    the reader then reads the segments it would have spared)."""
    snap = snapshot_path(path, number)
    try:
        record = json.loads(snap.read_bytes().decode("utf-8"))
        if not isinstance(record, dict) or record.get("schema") != SNAPSHOT_SCHEMA or record.get("segment") != number:
            raise ValueError(f"not a schema-{SNAPSHOT_SCHEMA} snapshot of segment {number}")
        if not isinstance(record.get("lines"), int) or not isinstance(record.get("parts"), dict):
            raise ValueError("its lines/parts fields are missing")
        return record
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: unreadable snapshot of the state log, ignored (the segments are read instead): %s", snap, exc)
        return None


@dataclass
class Chunk:
    """Lines of the log that follow a snapshot (``snapshot`` None: the log's start); ``first``: the first one's
    number in the whole log."""

    lines: list[bytes]
    first: int = 1
    snapshot: dict[str, Any] | None = None


@dataclass
class Tail:
    """What a bounded reader read: ``chunks`` newest first, each starting right after a snapshot (or at the log's
    start), and how many rotated segments that took."""

    chunks: list[Chunk] = field(default_factory=list)
    segments_read: int = 0


def _numbered(path: Path) -> list[tuple[int, Path]]:
    return [(seg_number[0], seg) for seg in segments(path) if (seg_number := _segment_number(path, seg))]


def read_tail(path: Path, *, want: Callable[[list[Chunk]], bool] | None = None) -> Tail:
    """The log read from its newest end, one chunk at a time (the live file and the segments since the newest
    snapshot, then each older segment), for as long as ``want(chunks so far)`` says more is needed (default:
    never — one chunk, after the newest snapshot).

    Each chunk starts right after a snapshot, so a reader resumes from what it says; segments without a snapshot
    between them (rotated without one) are read as one chunk. FileNotFoundError: no log at all. An unreadable
    segment is a warning, its lines missing, as in :func:`read_lines`."""
    numbered = _numbered(path)
    tail = Tail()
    try:
        pending: list[bytes] = path.read_bytes().splitlines()
    except FileNotFoundError:
        if not numbered:
            raise
        pending = []
    for i in range(len(numbered), -1, -1):  # pending: the lines after segment numbered[i - 1]
        snap = read_snapshot(path, numbered[i - 1][0]) if i > 0 else None
        if snap is not None or i == 0:
            tail.chunks.append(Chunk(pending, int(snap["lines"]) + 1 if snap else 1, snap))
            if i == 0 or want is None or not want(tail.chunks):
                return tail
            pending = []
        seg = numbered[i - 1][1]
        try:
            pending = _segment_lines(seg) + pending
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            log.warning("%s: unreadable segment of the state log, skipped: %s", seg, exc)
        tail.segments_read += 1
    return tail


Entries = list[dict[str, Any]]


def fold_states(path: Path, lines: list[bytes], first: int, entries: Entries, last: dict[str, Any] | None,
                check: Callable[[dict[str, Any]], object]) -> tuple[Entries, dict[str, Any] | None]:  # fmt: skip
    """The history entries (each passed through ``check``) and the last recorded state (with its generation),
    carried from ``entries``/``last`` over ``lines`` (the first numbered ``first``); events and unreadable lines
    (a warning naming them) add nothing."""
    entries = list(entries)
    for number, line in enumerate(lines, first):
        try:
            record = json.loads(line.decode("utf-8"))
            if isinstance(record, dict) and "state" not in record and record.get("event") in EVENTS:
                continue  # an event (a refusal, a champion move): no state in it
            new = [dict(e) for e in record["entries"]]
            for e in new:
                check(e)
            entries, last = entries + new, {**record["state"], "generation": record["generation"]}
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("%s line %d: skipped, unreadable (%s)", path, number, str(exc)[:120])
    return entries, last


def retained(entries: Entries, keep: int, serving: tuple[str, ...], live: set[int]) -> Entries:
    """What a snapshot keeps of the history before its cut: the newest ``keep`` entries whose action is one of
    ``serving``, the newest ``keep`` others, and the newest fingerprinted entry of each version they name or that
    is ``live`` at the cut. A later bounding of the history (:func:`seqcls.serving.state.bounded_history`, ``keep``
    ≥ its limit + 3) keeps nothing else: a version becomes live again only by a rollback, to a version the
    writers' own bounded history names — so recovering from a snapshot gives what the whole log gives, at a size
    that does not grow with the releases behind it."""
    served = [i for i, e in enumerate(entries) if e.get("action") in serving]
    others = [i for i, e in enumerate(entries) if e.get("action") not in serving]
    kept = set(served[-keep:]) | set(others[-keep:])
    named = live | {entries[i].get("version") for i in kept}
    newest = {e.get("version"): i for i, e in enumerate(entries) if e.get("fingerprint")}
    kept |= {i for v, i in newest.items() if v in named}
    return [e for i, e in enumerate(entries) if i in kept]


def _compress(plain: Path) -> Path:
    gz = plain.with_name(plain.name + ".gz")
    atomic_write(gz, gzip.compress(plain.read_bytes(), mtime=0))
    plain.unlink()
    return gz


def _snapshot(path: Path, number: int, live: bytes, summarizers: dict[str, Summarizer]) -> None:
    """Write the snapshot at the end of segment ``number`` (the live file ``live`` about to become it): each
    part from the previous snapshot's and the lines since (a segment rotated without one is read again)."""
    older: list[bytes] = []
    previous: dict[str, Any] | None = None
    for n, seg in reversed(_numbered(path)):
        previous = read_snapshot(path, n)
        if previous is not None:
            break
        older = _segment_lines(seg) + older  # unreadable: OSError, and this rotation writes no snapshot
    lines = older + live.splitlines()
    first = int(previous["lines"]) + 1 if previous else 1
    parts = {
        name: summarize((previous or {}).get("parts", {}).get(name) if previous else None, lines, first)
        for name, summarize in summarizers.items()
    }
    record = {"schema": SNAPSHOT_SCHEMA, "segment": number, "lines": first + len(lines) - 1, "at": now_iso(),
              "bytes": len(live), "parts": parts}  # fmt: skip
    atomic_write(snapshot_path(path, number), json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")


def rotate(path: Path, max_bytes: int | None = None, summarizers: dict[str, Summarizer] | None = None) -> Path | None:
    """When the log ``path`` is larger than ``max_bytes`` (default :data:`ROTATE_BYTES`): rename it whole, under
    its lock, to the next segment and compress that; returns the segment (None: left alone). A rotation killed
    before compressing leaves a plain segment every reader reads; the next rotation compresses it.

    ``summarizers``: the snapshot's parts (see :func:`read_tail`), written atomically *before* the rename — a
    snapshot whose segment does not exist is never read, and the next rotation writes it again. One that cannot
    be computed is a warning: the rotation goes on without it and readers read the whole log."""
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
        if summarizers:
            try:
                _snapshot(path, number, path.read_bytes(), summarizers)  # under the lock: no line can follow
            except Exception as exc:
                snapshot_path(path, number).unlink(missing_ok=True)
                log.warning("%s: no snapshot written at this rotation (%s); readers read the whole log", path, exc)
            faults.point("statelog:snapshot-written")
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
    "SNAPSHOT_SUFFIX",
    "STATE_PREFIX",
    "Chunk",
    "Summarizer",
    "Tail",
    "actor",
    "append_event",
    "append_line",
    "fold_states",
    "log_path",
    "now_iso",
    "read_lines",
    "read_snapshot",
    "read_tail",
    "retained",
    "rotate",
    "segments",
    "snapshot_path",
]
