"""The control key of a local Triton: Triton's restricted-API flags, the key file, masking.

Triton's model control (load, unload, repository index) can change what is served, and a python
model it loads runs arbitrary code, so every seqcls Triton starts with those APIs restricted to
callers that send the control key (:data:`seqcls.settings.CONTROL_HEADER`). Health, metadata,
inference, statistics and model configs stay open. The same key also guards shared memory, trace
and logging (a trace or log file path set over the API is a file written anywhere): seqcls never
calls them, nobody else should.

Where a local server's key comes from: ``TritonServerConfig.control_key`` (``SEQCLS_TRITON_CONTROL_KEY``
through ``from_settings``); else the key file :data:`~seqcls.settings.CONTROL_KEY_FILE` in the
model repository's root, generated on first start (``secrets.token_urlsafe(32)``, mode 0600, created
atomically so local replicas sharing one repository agree on one key). Clients find it there through
``Settings.control_key()``. The key is on the server's command line — Triton has no other way to take
it — so it is masked in everything seqcls logs, and kept out of the server's environment.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path

from seqcls.errors import InputError
from seqcls.files import check_private, create_private
from seqcls.settings import (
    CONTROL_HEADER,
    CONTROL_KEY_FILE,
    ENV_TRITON_CONTROL_KEY,
    check_control_key,
    read_control_key,
)

#: The APIs only a caller with the key may use (HTTP ``--http-restricted-api``, gRPC ``--grpc-restricted-protocol``).
RESTRICTED_APIS = ("model-repository", "shared-memory", "trace", "logging")
RESTRICTED_FLAGS = ("--http-restricted-api", "--grpc-restricted-protocol")
MASK = "***"


def restricted_flags(key: str) -> list[str]:
    """The two flags restricting :data:`RESTRICTED_APIS` to callers sending ``key`` (Triton 2.51 syntax)."""
    value = f"{','.join(RESTRICTED_APIS)}:{CONTROL_HEADER}={check_control_key(key, 'control_key')}"
    return [f"{flag}={value}" for flag in RESTRICTED_FLAGS]


def masked(argv: Sequence[str], key: str | None) -> list[str]:
    """``argv`` with ``key`` replaced by :data:`MASK`: what may be logged of a command line."""
    return [arg.replace(key, MASK) if key else arg for arg in argv]


def key_file(repository: Path) -> Path:
    return Path(repository) / CONTROL_KEY_FILE


def ensure_key(repository: Path) -> str:
    """The repository's key file, created (0600, atomically: the first of racing starts wins) if absent."""
    path = key_file(repository)
    existing = _read_private(path)
    if existing:
        return existing
    create_private(path, secrets.token_urlsafe(32) + "\n")  # another start may win the race: its key is used
    key = _read_private(path)
    if not key:
        raise InputError(f"{path} is empty; delete it to have a new Triton control key generated")
    return key


def _read_private(path: Path) -> str | None:
    """The key in ``path`` (None if absent); refused, like ssh does, when others may read it."""
    if not path.exists():  # (a dangling link too: a new key is generated)
        return None
    fix = f"delete it to have a new key generated (or set {ENV_TRITON_CONTROL_KEY})"
    check_private(path, "the Triton control key", fix)
    key = read_control_key(path.parent)
    return check_control_key(key, str(path)) if key else None
