"""Which backend a repository directory stands for: itself (POSIX) or the object store it is a working copy of.

Why a directory decides: every caller of the serving layer holds the repository as a directory
(``Settings.triton_repository``), in 50-odd places. An ``s3://`` setting makes that directory this host's
working copy of the store (:func:`seqcls.settings.store_working_copy`, which writes the marker naming the
store); the state, event, lease, publish and config functions look here once and, for a working copy, keep
their truth on the store (:mod:`seqcls.serving.s3state`, :mod:`~seqcls.serving.s3lease`,
:mod:`~seqcls.serving.s3repo`). A POSIX repository pays one ``stat``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from seqcls.errors import InputError
from seqcls.serving.objectstore import ObjectStore, S3Location
from seqcls.settings import STORE_MARKER, aws_s3_environment

_LOCK = threading.Lock()
#: One client per (store, endpoint, region, key id): building a boto3 client costs ~0.2 s.
_STORES: dict[tuple[str, str | None, str | None, str | None], ObjectStore] = {}


def store_uri(root: Path) -> str | None:
    """The ``s3://`` repository ``root`` is a working copy of, or None (a POSIX repository)."""
    marker = Path(root) / STORE_MARKER
    try:
        data = marker.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        uri = json.loads(data)["store"]
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{marker}: unreadable store marker ({exc}); delete it and set the repository again") from None
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise InputError(f"{marker}: names {uri!r}, not an s3:// repository; delete it and set the repository again")
    return uri


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
