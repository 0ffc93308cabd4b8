"""A release's own copy of its checkpoint: taken in once at resolve, hashed as it is copied, verified when reopened.

Why: the checkpoint directory is the operator's, and it may change while a release runs (a training
job saving again, a file relinked) — inside one process between fingerprint and export, or between
Airflow tasks on other workers. So resolve copies every file a release reads into
``<workspace>/checkpoint/`` (:data:`SNAPSHOT_DIR`) while hashing the very bytes it copies, and every
later step reads only that copy: what is fingerprinted is what is exported, validated and
published, and a change in place has no effect on the release. The copy holds plain files (a link
inside the checkpoint is followed when it stays inside, the rule of
:func:`~seqcls.checkpoints.checkpoint.inside_checkpoint`) and its record (:data:`RECORD`, inside
the copy, so both move into place with one rename) lists each file's sha256, size and origin.
:func:`verify` refuses a copy whose files differ from the record, or that holds any other file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from seqcls.checkpoints.checkpoint import sha256_file
from seqcls.errors import CheckpointError
from seqcls.files import atomic_write, copy_hashed, out_of_space, replace_dir, resource_error

log = logging.getLogger(__name__)

SNAPSHOT_DIR = "checkpoint"  # <workspace>/checkpoint/
RECORD = ".seqcls-snapshot.json"
CHUNK = 1 << 20


class DamagedSnapshot(CheckpointError):
    """A snapshot whose files no longer match its record (re-made from the source when that still can be)."""


@dataclass(frozen=True)
class Taken:
    """What a snapshot holds: each file's sha256 and size, where it was read from, and from which checkpoint."""

    source: str  # the operator's checkpoint directory
    files: dict[str, str]  # name in the snapshot -> sha256
    sizes: dict[str, int]
    origins: dict[str, str]  # name in the snapshot -> the file it was read from
    #: name in the snapshot -> how it was made from files taken in and no longer kept (``pytorch_model.bin``
    #: -> ``model.safetensors``: :meth:`seqcls.checkpoints.torchload.Conversion.to_dict`)
    converted: dict[str, dict] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, ensure_ascii=False, sort_keys=True)

    @property
    def megabytes(self) -> float:
        return sum(self.sizes.values()) / 1e6


def copy_file(src: Path, dst: Path) -> tuple[str, int]:
    """Copy ``src`` to the new file ``dst``, hashing the bytes copied: (sha256, size).

    ``src`` is opened without following a link in its last component (the caller resolved it and
    checked it stays inside the checkpoint), so a file swapped for a link meanwhile is refused.
    """
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{src}: disappeared while the checkpoint was read; retry when it is complete.") from exc
    except OSError as exc:
        raise CheckpointError(f"{src}: cannot be read ({exc.strerror}); a checkpoint holds readable files.") from exc
    with open(fd, "rb") as fin:
        if not stat.S_ISREG(os.fstat(fin.fileno()).st_mode):
            raise CheckpointError(f"{src}: is not a regular file; a checkpoint holds plain files.")
        try:
            return copy_hashed(fin, dst, chunk=CHUNK)
        except OSError as exc:
            if out_of_space(exc):
                raise resource_error(dst.parent, exc, f"copying {src.name} into the release workspace") from exc
            raise


def take(origins: dict[str, Path], into: Path, source: Path) -> Taken:
    """Copy each ``origins`` file into the new directory ``into`` under its name, hashing as it copies."""
    t0 = time.perf_counter()
    try:
        into.mkdir(parents=True)
    except OSError as exc:
        if out_of_space(exc):
            raise resource_error(into, exc, "creating the checkpoint snapshot") from exc
        raise
    files, sizes = {}, {}
    for name, origin in origins.items():
        files[name], sizes[name] = copy_file(origin, into / name)
    taken = Taken(str(source), files, sizes, {name: str(p) for name, p in origins.items()})
    try:
        atomic_write(into / RECORD, taken.to_json())
    except OSError as exc:
        if out_of_space(exc):
            raise resource_error(into, exc, "writing the checkpoint snapshot's record") from exc
        raise
    log.info(
        "checkpoint snapshot: %d files of %s, %.1f MB copied in %.2fs",
        len(files),
        source,
        taken.megabytes,
        time.perf_counter() - t0,
    )
    return taken


def keep_only(taken: Taken, into: Path, names: set[str]) -> Taken:
    """Drop from the snapshot ``into`` what it took only so the checks could look at it (another framework's
    files, weights this one ignores): what remains is what the release reads."""
    drop = sorted(set(taken.files) - names)
    if not drop:
        return taken
    for name in drop:
        (into / name).unlink()
    kept = Taken(
        taken.source,
        {n: d for n, d in taken.files.items() if n in names},
        {n: b for n, b in taken.sizes.items() if n in names},
        {n: o for n, o in taken.origins.items() if n in names},
        taken.converted,
    )
    atomic_write(into / RECORD, kept.to_json())
    log.info("checkpoint snapshot: %s not kept (not read by this release)", ", ".join(drop))
    return kept


def converted(taken: Taken, into: Path, sources: list[str], name: str, how: dict) -> Taken:
    """The record of snapshot ``into`` once ``sources`` were converted into its new file ``name`` (``how``):
    the sources are removed from the copy, ``name`` hashed and recorded with what it was made from."""
    digest = sha256_file(into / name)
    for source in sources:
        (into / source).unlink()
    origin = taken.origins.get(sources[0], "")
    kept = Taken(
        taken.source,
        {**{n: d for n, d in taken.files.items() if n not in sources}, name: digest},
        {**{n: b for n, b in taken.sizes.items() if n not in sources}, name: (into / name).stat().st_size},
        {**{n: o for n, o in taken.origins.items() if n not in sources}, name: origin},
        {**taken.converted, name: how},
    )
    atomic_write(into / RECORD, kept.to_json())
    return kept


def read_record(snap: Path) -> Taken:
    """The record of snapshot ``snap``; DamagedSnapshot when it is missing or unreadable."""
    path = snap / RECORD
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
        return Taken(
            str(data["source"]),
            dict(data["files"]),
            dict(data["sizes"]),
            dict(data["origins"]),
            dict(data.get("converted") or {}),
        )
    except FileNotFoundError as exc:
        raise DamagedSnapshot(f"{path}: missing — {snap} is not a complete checkpoint snapshot.") from exc
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DamagedSnapshot(f"{path}: unreadable snapshot record ({type(exc).__name__}: {exc}).") from exc


def verify(snap: Path) -> Taken:
    """The record of ``snap`` once every file it lists is there, a plain file with its size and sha256,
    and nothing else is; DamagedSnapshot naming the first file that is not."""
    taken = read_record(snap)
    extra = sorted(p.name for p in snap.iterdir() if p.name != RECORD and p.name not in taken.files)
    if extra:
        raise DamagedSnapshot(
            f"{snap / extra[0]}: not part of the checkpoint snapshot (its record lists "
            f"{', '.join(sorted(taken.files))}); a release reads only what it fingerprinted — remove it."
        )
    for name, digest in taken.files.items():
        path = snap / name
        if path.is_symlink() or not path.is_file():
            raise DamagedSnapshot(f"{path}: missing from the checkpoint snapshot (or not a plain file).")
        size = path.stat().st_size
        actual = sha256_file(path) if size == taken.sizes.get(name) else None
        if actual != digest:
            found = f"sha256 {actual[:16]}…" if actual else f"{size} bytes"
            raise DamagedSnapshot(
                f"{path}: damaged in the checkpoint snapshot ({found}, recorded sha256 {digest[:16]}…, "
                f"{taken.sizes.get(name)} bytes)."
            )
    return taken


def install(staging: Path, final: Path) -> None:
    """Put the finished snapshot ``staging`` at ``final`` (replacing what is there) with one rename each."""
    trash = final.parent / f".{final.name}.old.{os.getpid()}"
    shutil.rmtree(trash, ignore_errors=True)
    if final.exists():
        replace_dir(final, trash)
    replace_dir(staging, final)
    shutil.rmtree(trash, ignore_errors=True)
