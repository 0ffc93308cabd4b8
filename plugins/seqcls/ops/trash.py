"""What an interrupted ``seqcls gc`` leaves: a trash directory of things it had moved aside to delete.

gc renames what it collects into ``<home>/.gc-trash/<pid>-<ms>/`` (one rename each, the same file system as the
release home) before deleting it, so a workspace never holds half a directory. A gc killed between the two
leaves that trash, which nothing refers to: the next gc, or ``seqcls sync``, deletes it once its pid is gone.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from pathlib import Path

from seqcls import faults
from seqcls.files import replace_dir, replace_file
from seqcls.serving.pids import pid_alive
from seqcls.settings import Settings

log = logging.getLogger(__name__)

TRASH = ".gc-trash"


def trash_root(settings: Settings) -> Path:
    return settings.home / TRASH


def _trash_owner(name: str) -> int | None:
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def leftovers(settings: Settings) -> list[Path]:
    """Trash of a gc that is gone (killed, crashed): safe to delete, nothing refers to it."""
    root = trash_root(settings)
    found = []
    for p in sorted(root.iterdir()) if root.is_dir() else ():
        pid = _trash_owner(p.name)
        if pid is None or pid == os.getpid() or not pid_alive(pid):
            found.append(p)
    return found


def finish_leftovers(settings: Settings) -> list[str]:
    """Delete what an interrupted gc had already moved aside (``seqcls sync`` calls this too)."""
    removed = []
    for p in leftovers(settings):
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            removed.append(str(p))
    return removed


class Trash:
    """One gc's trash directory: each collected path is renamed into it (one rename, same file system)."""

    def __init__(self, settings: Settings) -> None:
        self.root = trash_root(settings) / f"{os.getpid()}-{int(time.time() * 1000)}"
        self.n = 0

    def take(self, path: Path) -> bool:
        """Move ``path`` aside; False (and a warning) when it cannot be renamed there (another file system)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.n += 1
        try:
            (replace_dir if path.is_dir() else replace_file)(path, self.root / f"{self.n}-{path.name}")
        except FileNotFoundError:
            return True  # already gone
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                log.warning("gc: %s is on another file system than %s; left in place", path, self.root)
                return False
            raise
        return True

    def empty(self) -> None:
        faults.point("gc:before-delete")
        shutil.rmtree(self.root, ignore_errors=True)


__all__ = ["TRASH", "Trash", "finish_leftovers", "leftovers", "trash_root"]
