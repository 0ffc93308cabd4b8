"""The completion marker a training job writes into a finished checkpoint, and ``latest`` chosen by it.

A checkpoint directory is *complete* when its training job says so: once every file is saved, the
job writes :data:`MARKER_FILE` into the directory, atomically and last (:func:`mark_complete`)::

    {"completed_at": "2025-01-31T12:00:00.000000Z", "fingerprint": "<sha256, optional>", "run": "<optional>"}

``latest`` (:func:`find_latest`) is the directory under the checkpoints root whose marker records
the newest ``completed_at`` — read from the marker's content, never from file times, so a
``cp -r`` of an old checkpoint (new mtimes, the old marker) does not become ``latest``. Directories
without a marker (still being written, or never marked) are skipped. A malformed marker is an
error rather than skipped: skipping it would silently release an older checkpoint on schedule. A
marker whose ``fingerprint`` no longer matches its directory's files (edited after training, or a
marker copied into another checkpoint) is refused.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from seqcls.checkpoints.checkpoint import CONFIG_FILE, LEGACY_CONFIG_FILE, inside_checkpoint, read_json
from seqcls.errors import CheckpointError, InputError
from seqcls.files import atomic_write
from seqcls.release.intake import directory_fingerprint, resolve_checkpoint

log = logging.getLogger(__name__)

MARKER_FILE = "SEQCLS_DONE.json"
HOW_TO_MARK = (
    f"the training job writes {MARKER_FILE} last, once every file of the checkpoint is saved: "
    "python -c 'from seqcls.release.completion import mark_complete; mark_complete(\"<checkpoint dir>\")'"
)
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Completion:
    """What a checkpoint's completion marker records."""

    path: Path  # the checkpoint directory
    completed_at: datetime  # timezone-aware
    fingerprint: str | None = None
    run: str | None = None

    @property
    def marker(self) -> Path:
        return self.path / MARKER_FILE

    def to_json(self) -> str:
        when = self.completed_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return json.dumps({"completed_at": when, "fingerprint": self.fingerprint, "run": self.run}, indent=2) + "\n"


def _completed_at(value: object, marker: Path) -> datetime:
    if value is None:
        raise CheckpointError(f"{marker}: field 'completed_at' is missing; {HOW_TO_MARK}.")
    try:
        when = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise CheckpointError(
            f"{marker}: field 'completed_at' is {value!r}, not an ISO-8601 time with a UTC offset "
            "(e.g. 2025-01-31T12:00:00Z)."
        )
    return when


def read_marker(directory: str | Path) -> Completion | None:
    """What ``directory``'s completion marker records: ``None`` without one, CheckpointError when malformed."""
    directory = Path(directory)
    marker = inside_checkpoint(directory.resolve(), MARKER_FILE)
    if not marker.exists() and not marker.is_symlink():
        return None
    data = read_json(marker, f"the completion marker; {HOW_TO_MARK}")
    fingerprint, run = data.get("fingerprint"), data.get("run")
    if fingerprint is not None and not (isinstance(fingerprint, str) and _FINGERPRINT.fullmatch(fingerprint)):
        raise CheckpointError(f"{marker}: field 'fingerprint' is {fingerprint!r}, not a sha256 hex digest (or null).")
    if run is not None and not isinstance(run, str):
        raise CheckpointError(f"{marker}: field 'run' is {run!r}, not a string (or null).")
    return Completion(directory, _completed_at(data.get("completed_at"), marker), fingerprint, run)


def mark_complete(path: str | Path, run: str | None = None, *, completed_at: datetime | None = None) -> Completion:
    """Validate the checkpoint at ``path`` and mark it complete: the training job's last step.

    Writes :data:`MARKER_FILE` atomically (temp file + rename) with ``completed_at`` (default: now,
    UTC), the checkpoint's fingerprint and ``run`` (the training run's id, free text). Marking a
    checkpoint again makes it the newest. Raises CheckpointError when the checkpoint could not be
    released (the message names the file), so an unreleasable checkpoint is never marked.
    """
    when = completed_at or datetime.now(UTC)
    if when.tzinfo is None:
        raise InputError(f"completed_at {when.isoformat()} has no timezone; pass an aware datetime (e.g. in UTC).")
    ckpt = resolve_checkpoint(path)
    done = Completion(ckpt.path, when, ckpt.fingerprint, run)
    atomic_write(done.marker, done.to_json())
    fp = ckpt.short_fingerprint
    log.info("checkpoint %s marked complete at %s (fingerprint %s)", ckpt.path, when.isoformat(), fp)
    return done


def _candidates(root: Path) -> list[Path]:
    """The directories under ``root`` that may be checkpoints (and ``root`` itself when it is one)."""
    dirs = sorted(p for p in root.iterdir() if p.is_dir())
    if any((root / name).exists() for name in (CONFIG_FILE, LEGACY_CONFIG_FILE, MARKER_FILE)):
        dirs.append(root)
    return dirs


def _verify(done: Completion) -> None:
    """Refuse ``done`` when its directory's files no longer hash to the fingerprint its marker records."""
    if done.fingerprint is not None:
        actual = directory_fingerprint(done.path)
        if actual != done.fingerprint:
            raise CheckpointError(
                f"{done.marker}: records fingerprint {done.fingerprint[:16]} but the files of {done.path} hash to "
                f"{actual[:16]} — the checkpoint changed after its training job marked it complete (edited, or "
                "the marker copied from another checkpoint); refusing it as 'latest'. Restore it, remove it, or "
                "mark it complete again if the change is intended."
            )


def find_latest(root: str | Path) -> Path:
    """The checkpoint under ``root`` whose completion marker records the newest ``completed_at``.

    Ties go to the greatest directory name. Directories without a marker are skipped (logged);
    a malformed marker or one whose fingerprint does not match its directory is a CheckpointError.
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        raise CheckpointError(f"{root}: checkpoints root does not exist; set SEQCLS_CHECKPOINTS_ROOT.")
    candidates = _candidates(root)
    found = [(p, read_marker(p)) for p in candidates]
    done = [c for _, c in found if c is not None]
    unmarked = [p.name or str(p) for p, c in found if c is None]
    if unmarked:
        names = ", ".join(unmarked[:10]) + (" …" if len(unmarked) > 10 else "")
        log.info(
            "latest: skipped %d of %d directories under %s without %s (still being written, or never marked "
            "complete by their training job): %s",
            len(unmarked), len(candidates), root, MARKER_FILE, names,
        )  # fmt: skip
    if not done:
        raise CheckpointError(
            f"{root}: no completed checkpoint found — none of its {len(candidates)} directories holds "
            f"{MARKER_FILE}; {HOW_TO_MARK}."
        )
    best = max(done, key=lambda c: (c.completed_at, c.path.name))
    tied = sorted(c.path.name for c in done if c.completed_at == best.completed_at and c is not best)
    if tied:
        log.info("latest: %s ties with %s on completed_at; the greatest name wins", best.path.name, ", ".join(tied))
    _verify(best)
    log.info("latest under %s → %s (completed_at %s, run %s)", root, best.path, best.completed_at.isoformat(), best.run)
    return best.path
