"""PyTorch pickled weights (``pytorch_model.bin``, or its shards with their index) read safely and
converted to ``model.safetensors`` — so everything after intake sees safetensors only.

Why: most Hugging Face checkpoints saved before safetensors became the default (and ModelScope's
models) carry ``pytorch_model.bin``, a zip whose ``data.pkl`` is a pickle; unpickling a hostile
one runs code. Two locks, in order, on the release's own copy of the file:

1. :func:`scan_torch_file` — static (nothing executed, no torch import): the zip must be what
   ``torch.save`` writes, and its ``data.pkl`` may import only what a state dict needs
   (:data:`TORCH_ALLOWED_GLOBALS`, the scan of :mod:`seqcls.checkpoints.safeload`); persistent ids
   are allowed there because that is how ``torch.save`` refers to tensor storages.
2. :func:`load_state_dict` — ``torch.load(weights_only=True)``, PyTorch's restricted unpickler
   (tensors and plain containers only; a persistent id other than a storage is refused by it);
   every value must then be a tensor under a string key.

The legacy (pre-1.6, non-zip) format is refused with what to do. :func:`convert` writes the
tensors as one ``model.safetensors`` (``format: pt``, as ``transformers`` saves it) and returns
what it converted from, for the snapshot's record and the release's evidence.
"""

from __future__ import annotations

import json
import logging
import re
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from seqcls.checkpoints.safeload import WHAT_TO_DO, scan_stream
from seqcls.errors import CheckpointError

log = logging.getLogger(__name__)

TORCH_WEIGHTS = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"
SAFETENSORS = "model.safetensors"
#: What ``save_pretrained(safe_serialization=False, max_shard_size=...)`` names its shards.
SHARD_NAME = re.compile(r"pytorch_model-\d{5}-of-\d{5}\.bin")
_STORAGES = ("Float", "Half", "BFloat16", "Double", "Long", "Int", "Short", "Char", "Byte", "Bool")
#: ``module.name`` of every global ``torch.save(model.state_dict())`` writes (torch 1.6 – 2.x).
TORCH_ALLOWED_GLOBALS = frozenset(
    {
        "collections.OrderedDict",
        "torch._utils._rebuild_tensor_v2",
        *(f"torch.{kind}Storage" for kind in _STORAGES),
    }
)
#: Opcodes torch.save never writes for a state dict (persistent ids: it does — storages).
_TORCH_REFUSED_OPCODES = frozenset({"EXT1", "EXT2", "EXT4", "PERSID"})
_TORCH_WHAT_TO_DO = (
    "re-save the weights with `save_pretrained(safe_serialization=True)` (model.safetensors) from the training "
    "environment"
)


@dataclass(frozen=True)
class Conversion:
    """What a ``model.safetensors`` in a snapshot was converted from: each source file and its sha256."""

    sources: dict[str, str]  # file name in the checkpoint -> sha256 of the bytes taken in
    tensors: int = 0
    parameters: int = 0
    loader: str = "torch.load(weights_only=True)"

    def to_dict(self) -> dict:
        return {
            "from": dict(self.sources),
            "to": SAFETENSORS,
            "tensors": self.tensors,
            "parameters": self.parameters,
            "loader": self.loader,
        }


def describe(converted: dict) -> str:
    """One line for tags and messages: ``pytorch_model.bin -> model.safetensors (torch.load(weights_only=True))``."""
    sources = sorted(converted.get("from") or {})
    main = TORCH_INDEX if TORCH_INDEX in sources else ", ".join(sources)
    shards = f" + {len(sources) - 1} shards" if TORCH_INDEX in sources else ""
    return f"{main}{shards} -> {converted.get('to', SAFETENSORS)} ({converted.get('loader', '?')})"


def _refuse(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"{path}: refused to load — {what}. Loading it could run code; {_TORCH_WHAT_TO_DO}.")


def scan_torch_file(path: Path) -> None:
    """Raise :class:`CheckpointError` unless ``path`` is a ``torch.save`` zip whose pickle imports only
    what a state dict needs. Static: nothing in the file is executed."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
            if head != b"PK\x03\x04":
                if head[:1] == b"\x80":
                    raise CheckpointError(
                        f"{path}: saved in PyTorch's legacy (pre-1.6, not zip) format, which seqcls does not read; "
                        f"{_TORCH_WHAT_TO_DO}."
                    )
                raise CheckpointError(
                    f"{path}: not a PyTorch weights file (a torch.save zip); copy the checkpoint again."
                )
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            prefix = names[0].split("/", 1)[0] if names else ""
            pickles = [n for n in names if n.endswith(".pkl")]
            if pickles != [f"{prefix}/data.pkl"]:
                raise _refuse(path, f"the archive holds pickles {pickles}; torch.save writes one, {prefix}/data.pkl")
            with archive.open(pickles[0]) as fh:
                scan_stream(
                    fh,
                    path,
                    allowed=TORCH_ALLOWED_GLOBALS,
                    refused=_TORCH_REFUSED_OPCODES,
                    writer="torch.save",
                )
    except CheckpointError as exc:
        raise CheckpointError(str(exc).replace(WHAT_TO_DO, _TORCH_WHAT_TO_DO)) from exc
    except PermissionError as exc:
        raise CheckpointError(f"{path}: not readable ({exc.strerror}); fix its permissions.") from exc
    except (zipfile.BadZipFile, ValueError, EOFError, UnicodeDecodeError, OSError) as exc:
        raise CheckpointError(
            f"{path}: truncated or corrupt — not a readable torch.save archive ({exc}); copy the checkpoint again."
        ) from exc


def read_index(path: Path) -> dict[str, str]:
    """The shard index's ``weight_map`` (tensor name -> shard file), each shard a plain name in the directory."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable shard index ({exc}); save_pretrained writes it as JSON.") from exc
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{path}: no weight_map; save_pretrained writes tensor name -> shard file there.")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not SHARD_NAME.fullmatch(shard):
            raise CheckpointError(
                f"{path}: weight_map[{name!r}] names {shard!r}, not a shard save_pretrained writes "
                "(pytorch_model-NNNNN-of-NNNNN.bin in the same directory)."
            )
    return {str(k): v for k, v in weight_map.items()}


def is_weight_file(name: str) -> bool:
    """Whether ``name`` is one of PyTorch's pickled weight files: the single file, a shard or the shard index."""
    return name in (TORCH_WEIGHTS, TORCH_INDEX) or SHARD_NAME.fullmatch(name) is not None


def shard_files(index: Path) -> list[str]:
    """The shard file names the index at ``index`` lists, in order."""
    return sorted(set(read_index(index).values()))


def _reason(exc: Exception) -> str:
    """The line of torch's weights-only refusal that says what the file held (not its boilerplate)."""
    boilerplate = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [line.strip().removeprefix("WeightsUnpickler error:").strip() for line in str(exc).splitlines()]
    kept = [line for line in lines if line and not line.startswith(boilerplate)]
    return " ".join(kept).rstrip(".") or type(exc).__name__


def load_state_dict(path: Path) -> dict:
    """The tensors of the (scanned) file at ``path``, through PyTorch's restricted unpickler."""
    import pickle

    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        what = f"PyTorch's restricted unpickler (weights_only=True) rejected what it holds: {_reason(exc)}"
        raise _refuse(path, what) from exc
    except (RuntimeError, ValueError, OSError, EOFError) as exc:
        raise CheckpointError(
            f"{path}: truncated or corrupt PyTorch weights ({exc}); copy the checkpoint again."
        ) from exc
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{path}: holds a {type(state).__name__}, not a state dict (tensor name -> tensor); save the model with "
            "save_pretrained."
        )
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise CheckpointError(
                f"{path}: entry {key!r} is a {type(value).__name__}, not a tensor; a state dict holds tensors only."
            )
    return state


def convert(sources: dict[str, str], root: Path, out: Path, index: str | None = None) -> Conversion:
    """Write the tensors of the torch files ``sources`` (name in ``root`` -> sha256) as ``out`` (safetensors).

    ``index`` (a shard index's name in ``root``): every tensor must be in the shard the index names,
    and every indexed tensor present. Each file is scanned statically before torch reads it."""
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    weight_map = read_index(root / index) if index else None
    merged: dict = {}
    seen_storage: set[int] = set()
    for name in sorted(n for n in sources if n != index):
        path = root / name
        scan_torch_file(path)
        for key, tensor in load_state_dict(path).items():
            if key in merged:
                raise CheckpointError(f"{path}: tensor {key!r} is also in another shard; the shards must not overlap.")
            if weight_map is not None and weight_map.get(key) != name:
                raise CheckpointError(
                    f"{path}: holds tensor {key!r}, which {root / index} puts in {weight_map.get(key)!r}; "
                    "the index and the shards are from different saves."
                )
            tensor = tensor.detach().contiguous()
            storage = tensor.untyped_storage().data_ptr()
            if storage in seen_storage:  # tied weights share a storage; safetensors stores each once
                tensor = tensor.clone()
            seen_storage.add(tensor.untyped_storage().data_ptr())
            merged[key] = tensor
    if weight_map is not None and (missing := sorted(set(weight_map) - set(merged))):
        raise CheckpointError(
            f"{root / index}: lists {len(missing)} tensors no shard holds (first: {missing[0]!r}); the checkpoint is "
            "incomplete — copy it again."
        )
    save_file(merged, str(out), metadata={"format": "pt"})
    conversion = Conversion(dict(sources), tensors=len(merged), parameters=int(sum(t.numel() for t in merged.values())))
    log.info(
        "checkpoint: %s converted to %s — %d tensors, %.1f M parameters, read by torch.load(weights_only=True) "
        "after a static scan, in %.2fs",
        f"{index} and its {len(sources) - 1} shards" if index else ", ".join(sorted(sources)),
        out.name,
        conversion.tensors,
        conversion.parameters / 1e6,
        time.perf_counter() - t0,
    )
    return conversion
