"""What an interrupted ``seqcls gc`` leaves: a trash directory of things it had moved aside to delete.

gc renames what it collects into ``<home>/.gc-trash/<pid>-<ms>/`` (one rename each, the same file system as the
release home) before deleting it, so a workspace never holds half a directory. A gc killed between the two
leaves that trash, which nothing refers to: the next gc, or ``seqcls sync``, deletes it once its pid is gone.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from seqcls.serving.lease import pid_alive
from seqcls.settings import Settings

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


__all__ = ["TRASH", "finish_leftovers", "leftovers", "trash_root"]
