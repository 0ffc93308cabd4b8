"""Refuse pickled weights that would import anything but arrays — without unpickling them — and
weight files that are not whole (:func:`check_weight_file`).

A ``model_state.pdparams`` is a pickle, and ``paddle.load`` (which PaddleNLP's
``from_pretrained`` calls) unpickles it: a hostile file whose pickle reduces to ``os.system``
runs its command in the worker. :func:`scan_pickle` reads the opcode stream statically
(:func:`pickletools.genops`, nothing is executed) and simulates the stack just enough to know
every global the pickle would import (``GLOBAL``, ``INST``, and ``STACK_GLOBAL`` with its
module/name strings tracked through the memo). Only what ``paddle.save`` writes for a state dict
is admitted (:data:`ALLOWED_GLOBALS`); anything else, anything that cannot be determined
statically, or a malformed stream raises :class:`~seqcls.errors.CheckpointError`.

What ``paddle.save(state_dict)`` writes (paddle 3, numpy 1.26; protocol 4 by default, 2 allowed):
numpy arrays as ``numpy.core.multiarray._reconstruct(numpy.ndarray, ...)`` with a
``numpy.dtype``; with protocol 2 the raw bytes as ``_codecs.encode(str, 'latin1')``; a
``paddle.Tensor`` (rather than an ndarray) as ``builtins.tuple((name, ndarray))``; numpy 2
spells the module ``numpy._core.multiarray``; ``state_dict()`` itself is a
``collections.OrderedDict``. Paddle saves a raw ``DenseTensor`` as ``builtins.eval`` — that is
deliberately *not* admitted.
"""

from __future__ import annotations

import _compat_pickle
import json
import logging
import os
import pickletools
import struct
from pathlib import Path

from seqcls.errors import CheckpointError
from seqcls.settings import ENV_ALLOW_UNSAFE_PICKLE, allow_unsafe_pickle

log = logging.getLogger(__name__)

#: ``module.name`` of every global ``paddle.save`` legitimately writes for a state dict.
ALLOWED_GLOBALS = frozenset(
    {
        "numpy.core.multiarray._reconstruct",
        "numpy._core.multiarray._reconstruct",
        "numpy.ndarray",
        "numpy.dtype",
        "_codecs.encode",
        "builtins.tuple",
        "collections.OrderedDict",
    }
)

#: Opcodes that can reach code without naming it in the stream (copyreg extensions,
#: persistent ids resolved by the unpickler) — never written by ``paddle.save``.
_REFUSED_OPCODES = frozenset({"EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"})

_STRING_OPCODES = frozenset(
    {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
)

WHAT_TO_DO = (
    "re-save the weights as model.safetensors with `save_pretrained(safe_serialization=True)`, "
    f"or, if you trust this file, set {ENV_ALLOW_UNSAFE_PICKLE}=1 (not recommended)"
)


class _Mark:
    """The MARK sentinel on the simulated stack."""


class _Unknown:
    """A stack value the scan does not track (anything but a string)."""


_MARK = _Mark()
_UNKNOWN = _Unknown()


def _refuse(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"{path}: refused to load — {what}. Loading it could run code; {WHAT_TO_DO}.")


def _check_global(
    path: Path, module: object, name: object, pos: int, proto: int, allowed: frozenset[str], writer: str
) -> None:
    if not isinstance(module, str) or not isinstance(name, str):
        raise _refuse(path, f"the pickle imports a global whose name cannot be determined statically (byte {pos})")
    if proto < 3:  # what Unpickler.find_class really imports (fix_imports maps Python 2 names)
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
    qualified = f"{module}.{name}"
    if qualified not in allowed:
        raise _refuse(
            path,
            f"the pickle imports {qualified} (byte {pos}), which {writer} never writes for a state dict "
            f"(allowed: {', '.join(sorted(allowed))})",
        )


def _pop_to_mark(stack: list, path: Path, pos: int) -> None:
    while stack:
        if stack.pop() is _MARK:
            return
    raise _refuse(path, f"malformed pickle (no MARK on the stack at byte {pos})")


def _pop(stack: list, n: int, path: Path, pos: int) -> list:
    if n > len(stack) or any(v is _MARK for v in stack[len(stack) - n :]):
        raise _refuse(path, f"malformed pickle (stack underflow at byte {pos})")
    if n == 0:
        return []
    popped = stack[-n:]
    del stack[-n:]
    return popped


def scan_stream(
    fh,
    path: Path,
    *,
    allowed: frozenset[str] = ALLOWED_GLOBALS,
    refused: frozenset[str] = _REFUSED_OPCODES,
    writer: str = "paddle.save",
) -> None:
    """Simulate the opcode stream of ``fh``: every global it would import must be in ``allowed``."""
    stack: list = []
    memo: dict[int, object] = {}
    saw_stop = False
    proto = 0
    for op, arg, pos in pickletools.genops(fh):
        name = op.name
        pos = pos if pos is not None else -1
        if name in refused:
            raise _refuse(path, f"the pickle uses opcode {name} (byte {pos}), which {writer} never writes")
        if name == "PROTO":
            proto = int(arg)
        if name == "STOP":
            saw_stop = True
            break
        if name in _STRING_OPCODES:
            stack.append(arg.decode("latin1") if isinstance(arg, bytes) else arg)
        elif name in ("GLOBAL", "INST"):
            module, _, qualname = str(arg).partition(" ")
            _check_global(path, module, qualname, pos, proto, allowed, writer)
            if name == "INST":
                _pop_to_mark(stack, path, pos)
            stack.append(_UNKNOWN)
        elif name == "STACK_GLOBAL":
            module, qualname = _pop(stack, 2, path, pos)
            _check_global(path, module, qualname, pos, proto, allowed, writer)
            stack.append(_UNKNOWN)
        elif name == "MARK":
            stack.append(_MARK)
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            if not stack or stack[-1] is _MARK:
                raise _refuse(path, f"malformed pickle (nothing to memoize at byte {pos})")
            memo[len(memo) if name == "MEMOIZE" else int(arg)] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if int(arg) not in memo:
                raise _refuse(path, f"malformed pickle (memo {arg} read before it is written, byte {pos})")
            stack.append(memo[int(arg)])
        elif name == "DUP":
            if not stack or stack[-1] is _MARK:
                raise _refuse(path, f"malformed pickle (DUP on an empty stack at byte {pos})")
            stack.append(stack[-1])
        elif name == "POP":
            if stack and stack[-1] is _MARK:
                stack.pop()
            else:
                _pop(stack, 1, path, pos)
        elif name == "POP_MARK":
            _pop_to_mark(stack, path, pos)
        else:
            before = op.stack_before
            if pickletools.markobject in before:
                # [items..., markobject, stackslice]: everything down to the mark, then the items.
                _pop_to_mark(stack, path, pos)
                _pop(stack, before.index(pickletools.markobject), path, pos)
            else:
                _pop(stack, len(before), path, pos)
            stack.extend(_UNKNOWN for _ in op.stack_after)
    if not saw_stop:
        raise _refuse(path, "malformed pickle (no STOP opcode)")


def scan_pickle(path: Path, *, allow_unsafe: bool = False) -> None:
    """Raise :class:`CheckpointError` unless the pickle at ``path`` imports only array types.

    Static: the file is read with :func:`pickletools.genops`; nothing in it is executed.
    The scan is skipped only when the release asks (``allow_unsafe``: the ``allow_unsafe_pickle``
    param / ``--allow-unsafe-pickle``) *and* the machine permits it (``SEQCLS_ALLOW_UNSAFE_PICKLE=1``,
    the operator's setting): whoever can trigger a DAG cannot switch the protection off alone.
    Logged as UNSAFE every time.
    """
    path = Path(path)
    if allow_unsafe and not allow_unsafe_pickle():
        raise CheckpointError(
            f"{path}: the release asks to load it without the pickle scan (allow_unsafe_pickle), but this machine "
            f"does not permit it: an operator must set {ENV_ALLOW_UNSAFE_PICKLE}=1 on the worker (not recommended; "
            "re-save the weights as model.safetensors instead)."
        )
    if allow_unsafe:
        log.warning(
            "UNSAFE: %s=1 and allow_unsafe_pickle — %s is NOT scanned and will be unpickled as it is; a hostile "
            "file runs code as this user. Unset it and release model.safetensors instead.",
            ENV_ALLOW_UNSAFE_PICKLE,
            path,
        )
        return
    try:
        with open(path, "rb") as fh:
            if fh.read(4) == b"PK\x03\x04":
                raise _refuse(path, "it is a zip archive, which paddle.save never writes for a state dict")
            fh.seek(0)
            scan_stream(fh, path)
    except CheckpointError:
        raise
    except PermissionError as exc:
        raise CheckpointError(f"{path}: not readable ({exc.strerror}); fix its permissions.") from exc
    except (ValueError, EOFError, UnicodeDecodeError, OSError) as exc:
        raise CheckpointError(
            f"{path}: truncated or corrupt — not a readable pickle ({exc}); copy the checkpoint again."
        ) from exc


def check_weight_file(path: Path) -> None:
    """Cheap integrity checks that catch truncated or corrupt weight files before export."""
    try:
        size = path.stat().st_size
        if size == 0:
            raise CheckpointError(f"{path}: weight file is empty; copy the checkpoint again.")
        with open(path, "rb") as fh:
            head = fh.read(16)
            if path.suffix == ".safetensors":
                (header_len,) = struct.unpack("<Q", head[:8])
                if header_len <= 0 or 8 + header_len > size:
                    raise CheckpointError(f"{path}: corrupt safetensors header (length {header_len}).")
                fh.seek(8)
                header = json.loads(fh.read(header_len))
                end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
                if 8 + header_len + end != size:
                    raise CheckpointError(
                        f"{path}: truncated or corrupt — header announces {8 + header_len + end} bytes, "
                        f"file has {size}; copy the checkpoint again."
                    )
            else:
                # A .pdparams file is a pickle: protocol marker first, STOP opcode ('.') last.
                fh.seek(-1, os.SEEK_END)
                tail = fh.read(1)
                if not head.startswith(b"\x80") or tail != b".":
                    raise CheckpointError(
                        f"{path}: truncated or corrupt (not a complete pickle: starts {head[:2]!r}, "
                        f"ends {tail!r}); copy the checkpoint again."
                    )
    except PermissionError as exc:
        raise CheckpointError(f"{path}: not readable ({exc.strerror}); fix its permissions.") from exc
    except (struct.error, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: corrupt weight file ({exc}).") from exc
