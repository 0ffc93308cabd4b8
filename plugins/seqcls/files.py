"""Files on disk: the one durable writer and the bounded, named lock every seqcls writer goes through.

A reader of a seqcls file (the serving state, a lease, a config.pbtxt Triton loads, a manifest, a
completion marker) must see the old content or the new one, never half, and after a crash the new
one only if it was fully written. So a file is replaced in one way: written to a unique temp file
in the same directory (``.<name>.<pid>.<random>.tmp``: the pid lets ``seqcls sync`` tell a dead
writer's leftovers from a live one's), flushed and fsynced, renamed over the target, and the
directory fsynced so the rename itself survives. Trees built elsewhere (a staged version
directory, a step's outputs) and files written by other libraries are moved into place with one
rename and the same directory fsync (:func:`replace_dir`, :func:`replace_file`).

``flock`` alone waits forever and says nothing about who holds it. In :func:`held` a waiter gives
up after ``timeout`` seconds with a message naming the holder (host, pid, since, what it is
doing), which the holder writes into the lock file while it holds it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from seqcls.errors import InputError, ResourceError, ServingError


def fsync_dir(directory: Path) -> None:
    """Make the entries of ``directory`` (a rename into it) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | str, *, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``data`` (text is encoded with ``encoding``) all at once, durably.

    A reader sees the old or the new file, never half; a failure (or a crash) before the rename
    leaves the old file and removes the temp file.
    """
    path = Path(path)
    payload = data.encode(encoding) if isinstance(data, str) else data
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name.lstrip('.')}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def create_private(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text``, mode 0600, complete or not at all; False when it exists already.

    For a secret generated on first use: written to a unique temporary file and linked into place, so
    of two racing first starts one wins and the other reads the winner's (never a half-written file).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


def check_private(path: Path, what: str, fix: str) -> None:
    """Refuse a secret's file, like ssh does, unless it is a regular file only its owner may read.

    ``what`` names it ("the Triton control key"), ``fix`` says what else to do besides ``chmod 600``.
    """
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        raise InputError(f"{what} {path} is not a regular file; {fix}")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InputError(
            f"{what} {path} is readable by others (mode {stat.filemode(mode)}): `chmod 600 {path}`, or {fix}"
        )


def replace_file(src: Path, dst: Path) -> None:
    """Move the finished file ``src`` over ``dst`` (same filesystem): data fsynced, one rename, directory fsynced."""
    fd = os.open(src, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)


def replace_dir(src: Path, dst: Path) -> None:
    """Move the finished directory ``src`` to ``dst`` with one rename, then fsync ``dst``'s parent.

    ``dst`` must not exist or be an empty directory (else OSError ENOTEMPTY/EEXIST: a directory is
    never merged). The tree's files are not fsynced one by one: whoever reads them after a crash
    checks their hashes (release.json, the manifest).
    """
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)


@contextlib.contextmanager
def held(path: Path, *, timeout: float, what: str, error: type[Exception] = ServingError) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for the block; ``error`` naming the holder after ``timeout``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    with open(path, "a+") as fh:
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = path.read_text(encoding="utf-8").strip() or "an unnamed process"
                    raise error(
                        f"{path}: held by {holder} for more than {timeout:.0f}s ({what}). Wait for it, or stop "
                        "that process if it hung; the lock is released the moment it exits."
                    ) from None
                time.sleep(0.2)
        fh.seek(0)
        fh.truncate()
        fh.write(f"{socket.gethostname()} pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%S')} ({what})")
        fh.flush()
        try:
            yield
        finally:
            fh.seek(0)
            fh.truncate()
            fh.flush()
            fcntl.flock(fh, fcntl.LOCK_UN)


def copy_hashed(source: BinaryIO, dst: Path, *, chunk: int = 1 << 20) -> tuple[str, int]:
    """Copy the open ``source`` into the new file ``dst`` (never over an existing one), hashing the bytes
    as they are written: (sha256, size). One read — what was hashed is what was written."""
    h, size = hashlib.sha256(), 0
    with open(dst, "xb") as out:
        while block := source.read(chunk):
            h.update(block)
            out.write(block)
            size += len(block)
    return h.hexdigest(), size


def out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a full disk or an exhausted quota."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def resource_error(path: Path, exc: BaseException, what: str) -> ResourceError:
    """The seqcls error for ``exc`` while ``what`` under ``path``: names the path and its free space."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = f"{shutil.disk_usage(probe).free / 1e6:.1f} MB free there"
    except OSError:
        free = "free space unknown"
    return ResourceError(f"{path}: {what} failed — {exc} ({free}). Free space on that volume and retry.")
