"""Pins: each published version's ``release.json`` kept outside its directory, beside the serving state.

A version's ``release.json`` holds the sha256 of every file of it; when the version directory is
deleted (by hand, or lost with a volume) those hashes went with it, and nothing could prove a copy
genuine. So publish also writes, for every version, one plain file at the repository root where the
serving state lives: ``<repository>/.seqcls-pins.<model_name>.v<N>.json`` (a dot file, not a
directory: Triton lists every subdirectory of the repository as a model). It holds each Triton
model's ``release.json`` bytes (hence every file hash) and the bytes of the version's small files
(rendered configs, the serving code, a vocabulary: each at most :data:`KEEP_MAX`), so ``seqcls sync``
(:mod:`seqcls.serving.restore`) can put a deleted version back byte-identically from its release
workspace, checking every hash. Versions published before pins existed have none: their own
``release.json`` is all there is, as before.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqcls.contract import shipped
from seqcls.contract.names import ModelName, ServingNames, require_name
from seqcls.files import atomic_write
from seqcls.serving.statelog import now_iso

log = logging.getLogger(__name__)

PIN_PREFIX = ".seqcls-pins."
SCHEMA = 1
#: Files of a version up to this size are kept in its pin byte for byte (the big ones — the ONNX graph, a
#: tokenizer.json — are found again in the release workspace by their hash).
KEEP_MAX = 256 * 1024
RELEASE_FILE: str = shipped.contract().RELEASE_FILE


def pin_path(repository: Path, model: ModelName, version: int) -> Path:
    return Path(repository) / f"{PIN_PREFIX}{require_name(model)}.v{int(version)}.json"


@dataclass(frozen=True)
class PinnedModel:
    """One Triton model's part of a pinned version: its ``release.json`` bytes and its small files."""

    release_json: bytes
    kept: dict[str, bytes]

    @property
    def info(self) -> dict[str, Any]:
        return json.loads(self.release_json.decode("utf-8"))

    @property
    def files(self) -> dict[str, str]:
        return dict(self.info.get("files") or {})


@dataclass(frozen=True)
class Pin:
    """What ``version`` of ``model_name`` was when it was published, by Triton model."""

    model_name: str
    version: int
    models: dict[str, PinnedModel]
    path: Path


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def write_pin(repository: Path, names: ServingNames, version: int, vdirs: dict[str, Path]) -> Path:
    """Pin ``version`` from its finished directories (``vdirs``: Triton model → directory, e.g. the
    publish's temporary one, before it is renamed into place); atomic, returns the pin's path."""
    models: dict[str, Any] = {}
    for model in names.models:
        vdir = vdirs[model]
        raw = (vdir / RELEASE_FILE).read_bytes()
        files = json.loads(raw.decode("utf-8")).get("files") or {}
        kept = {}
        for rel in sorted(files):
            p = vdir / rel
            if p.is_file() and p.stat().st_size <= KEEP_MAX:
                kept[rel] = _b64(p.read_bytes())
        models[model] = {"release_json": _b64(raw), "sha256": hashlib.sha256(raw).hexdigest(), "kept": kept}
    record = {
        "schema": SCHEMA,
        "model_name": names.model_name,
        "version": int(version),
        "pinned_at": now_iso(),
        "models": models,
    }
    path = pin_path(repository, names.model_name, version)
    atomic_write(path, json.dumps(record, indent=1) + "\n")
    return path


def _parse(path: Path, model_name: str, version: int) -> Pin:
    record = json.loads(path.read_bytes().decode("utf-8"))
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise ValueError(f"schema {record.get('schema') if isinstance(record, dict) else None!r} is not {SCHEMA}")
    if record.get("model_name") != model_name or record.get("version") != version:
        raise ValueError(f"it pins {record.get('model_name')!r} version {record.get('version')!r}")
    models = {}
    for model, part in dict(record["models"]).items():
        raw = base64.b64decode(part["release_json"], validate=True)
        if hashlib.sha256(raw).hexdigest() != part["sha256"]:
            raise ValueError(f"the release.json of {model} does not match its sha256")
        kept = {str(rel): base64.b64decode(data, validate=True) for rel, data in dict(part.get("kept") or {}).items()}
        pinned = PinnedModel(raw, kept)
        if not isinstance(pinned.info, dict):
            raise ValueError(f"the release.json of {model} is not a JSON object")
        models[str(model)] = pinned
    return Pin(model_name, version, models, path)


def read_pin(repository: Path, model: ModelName, version: int) -> Pin | None:
    """``version``'s pin; None when it has none (published before pins) or it is unreadable (a warning
    naming the file: the version is then checked against its own ``release.json`` only, as before pins)."""
    path = pin_path(repository, model, version)
    try:
        return _parse(path, str(model), int(version))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("%s: unreadable pin, ignored (%s); version %s is checked against its own release.json", path, exc,
                    version)  # fmt: skip
        return None


def drop_pin(repository: Path, model: ModelName, version: int) -> None:
    """Remove ``version``'s pin (the version was pruned: nothing will restore it)."""
    pin_path(repository, model, version).unlink(missing_ok=True)


__all__ = ["KEEP_MAX", "PIN_PREFIX", "Pin", "PinnedModel", "drop_pin", "pin_path", "read_pin", "write_pin"]
