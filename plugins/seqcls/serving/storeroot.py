"""Which backend a repository directory stands for: itself (POSIX) or the object store it is a working copy of.

Why a directory decides: every caller of the serving layer holds the repository as a directory
(``Settings.triton_repository``), in 50-odd places. An ``s3://`` setting makes that directory this host's
working copy of the store, whose path names the store (:func:`seqcls.settings.store_working_copy`); the
state, event, lease, publish and config functions look here and, for a working copy, keep their truth on
the store (:mod:`seqcls.serving.s3state`, :mod:`~seqcls.serving.s3lease`, :mod:`~seqcls.serving.s3repo`).
A POSIX repository costs a scan of its path's parts, no I/O.
"""

from __future__ import annotations

import threading
from pathlib import Path

from seqcls.serving.objectstore import ObjectStore, S3Location
from seqcls.settings import STORES_DIR, aws_s3_environment

_LOCK = threading.Lock()
#: One client per (store, endpoint, region, key id): building a boto3 client costs ~0.2 s.
_STORES: dict[tuple[str, str | None, str | None, str | None], ObjectStore] = {}


def store_uri(root: Path) -> str | None:
    """The ``s3://`` repository ``root`` is a working copy of (``…/triton/stores/s3/<bucket>/<prefix>``,
    :func:`seqcls.settings.store_working_copy`), or None (a POSIX repository)."""
    parts = Path(root).parts
    n = len(STORES_DIR)
    for i in range(len(parts) - n, -1, -1):
        if parts[i : i + n] == STORES_DIR and len(parts) > i + n:
            return "s3://" + "/".join(parts[i + n :])
    return None


def store_at(root: Path) -> ObjectStore | None:
    """The object store ``root`` stands for (endpoint, region, credentials from the AWS variables), or None."""
    uri = store_uri(root)
    if uri is None:
        return None
    env = aws_s3_environment()
    key = (uri, env["endpoint"], env["region"], env["access_key_id"])
    with _LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = ObjectStore(S3Location.parse(uri, environment=env))
    return store


__all__ = ["store_at", "store_uri"]
