"""A bounded, named exclusive lock on a file: what every seqcls lock waits through.

``flock`` alone waits forever and says nothing about who holds it. Here a waiter gives up after
``timeout`` seconds with a message naming the holder (host, pid, since, what it is doing), which
the holder writes into the lock file while it holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from seqcls.errors import ServingError


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
