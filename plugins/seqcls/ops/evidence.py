"""The evidence horizon: an old release's small evidence compacted into one compressed audit record.

gc collects a release workspace's heavy artifacts but its evidence (manifest, gate reports, plots, HTML) stayed
for ever: a few hundred kilobytes per release, unbounded for a daily schedule. Releases older than the newest
``evidence_keep`` of the model, and kept for no other reason (serving, rollback, restore, the champion, a
refused attempt kept, a recent write), are compacted: every file of the workspace is hashed into one gzip'd
JSON record at ``<home>/releases/<model>/.audit/<fp16>.json.gz`` — the manifest (what ran, every output's
hash, the verdicts), the JSON/text reports embedded, plots and HTML (regenerable from those) only named with
their hash and size — then the workspace goes.

Crash safety: the record is written atomically *before* the workspace is moved into gc's trash (one rename);
a gc killed between the two leaves both (nothing lost), the next gc compacts it again (same content) and moves
it; killed after the move, the trash is what :mod:`seqcls.ops.trash` finishes.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls import faults
from seqcls.errors import SeqclsError
from seqcls.files import atomic_write, held
from seqcls.ops.disk import AUDIT_DIR, AUDIT_SUFFIX, HEAVY, audit_dir, tree_bytes
from seqcls.ops.trash import Trash
from seqcls.release.workspace import FAILED_DIR, MANIFEST
from seqcls.settings import Settings

SCHEMA = 1
#: Files embedded in the record (reports a person or a tool reads); anything else is named with its hash only.
EMBEDDED = (".json", ".jsonl", ".txt", ".tsv", ".csv", ".md", ".log", ".yaml", ".yml")
#: A larger text file is named with its hash only (the record stays small).
MAX_EMBEDDED = 1_000_000
#: Reports named with their hash only whatever their size: the framework's answer to every parity text (the
#: smoke test's reference while the release can serve; ``parity/report.json`` keeps what was measured of it) —
#: a third of a record, kept once a day for ever.
NOT_EMBEDDED = ("parity/expected.json",)
LOCK = ".lock"


def audit_path(settings: Settings, model: str, name: str) -> Path:
    """The audit record of release workspace ``name`` (its fingerprint's first 16 hex)."""
    return audit_dir(settings, model) / f"{name}{AUDIT_SUFFIX}"


def read_record(path: Path) -> dict[str, Any] | None:
    """A compacted release's audit record; None when missing or unreadable."""
    try:
        data = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, ValueError, EOFError):
        return None
    return data if isinstance(data, dict) else None


def records(settings: Settings, model: str) -> dict[str, Path]:
    """Workspace name → its audit record, for every compacted release of ``model``."""
    root = audit_dir(settings, model)
    found = sorted(root.glob(f"*{AUDIT_SUFFIX}")) if root.is_dir() else []
    return {p.name[: -len(AUDIT_SUFFIX)]: p for p in found}


def _last_write(ws: Path, manifest: dict[str, Any] | None) -> str:
    """When the release last wrote its workspace: the manifest's ``updated_at``, else the manifest's mtime."""
    when = (manifest or {}).get("updated_at")
    if isinstance(when, str) and when:
        return when
    try:
        mtime = (ws / MANIFEST).stat().st_mtime
    except OSError:
        mtime = 0.0
    return datetime.fromtimestamp(mtime, UTC).isoformat(timespec="seconds")


def beyond_horizon(manifests: dict[Path, dict[str, Any] | None], keep: int) -> list[Path]:
    """The workspaces older than the newest ``keep`` (by their last write), oldest first."""
    ranked = sorted(manifests, key=lambda ws: (_last_write(ws, manifests[ws]), ws.name), reverse=True)
    return sorted(ranked[keep:], key=lambda ws: (_last_write(ws, manifests[ws]), ws.name))


def _entry(path: Path, rel: str) -> dict[str, Any]:
    data = path.read_bytes()
    entry: dict[str, Any] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    if path.suffix.lower() in EMBEDDED and len(data) <= MAX_EMBEDDED and rel not in NOT_EMBEDDED:
        text = data.decode("utf-8", errors="replace")
        if path.suffix.lower() == ".json":
            try:
                entry["json"] = json.loads(text)
                return entry
            except ValueError:
                pass
        entry["text"] = text
        return entry
    entry["dropped"] = True  # plots, HTML: regenerable from the reports kept; the reference answers
    return entry


def build_record(ws: Path, model: str) -> dict[str, Any]:
    """Everything of ``ws`` worth auditing later: its manifest and each file's hash (reports embedded)."""
    files: dict[str, dict[str, Any]] = {}
    for root, dirs, names in os.walk(ws):
        dirs.sort()
        for name in sorted(names):
            path = Path(root) / name
            rel = path.relative_to(ws).as_posix()
            if rel in (MANIFEST, LOCK) or path.is_symlink():
                continue
            files[rel] = _entry(path, rel)
    manifest = json.loads((ws / MANIFEST).read_text(encoding="utf-8")) if (ws / MANIFEST).is_file() else {}
    return {
        "schema": SCHEMA,
        "model_name": model,
        "workspace": str(ws),
        "compacted_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "manifest": manifest,
        "files": files,
    }


@dataclass
class Planned:
    """A release workspace to compact: its record, the bytes of its evidence, whether a gc was interrupted."""

    workspace: Path
    record: Path
    bytes: int
    interrupted: bool = False

    def parts(self, keep: int) -> list[str]:
        why = f"older than the newest {keep} releases: compacted into {AUDIT_DIR}/{self.record.name}"
        return [why + ("; a gc was interrupted after writing it: finished now" if self.interrupted else "")]


def plan(settings: Settings, model: str, manifests: dict[Path, dict[str, Any] | None], held_whole: set[Path],
         keep: int) -> list[Planned]:  # fmt: skip
    """The workspaces beyond the newest ``keep`` that nothing else holds (``held_whole``: kept for a reason)."""
    out = []
    for ws in beyond_horizon(manifests, keep):
        if ws in held_whole or manifests[ws] is None:
            continue
        record = audit_path(settings, model, ws.name)
        size = sum(tree_bytes(e) for e in ws.iterdir() if e.name not in HEAVY and e.name != FAILED_DIR)
        out.append(Planned(ws, record, size, record.is_file()))
    return out


@dataclass
class Compacted:
    """One compacted release: its record, and the bytes its workspace held."""

    record: Path
    freed: int


def compact(ws: Path, record: Path, trash: Trash, model: str, freed: int) -> Compacted:
    """Under the workspace's lock (a step writing it makes gc skip it, a SeqclsError): write the audit record
    atomically, then move the workspace into the trash (one rename). Re-running it finishes an interrupted one."""
    if not (ws / MANIFEST).is_file():  # gone since the plan (or never a release): never overwrite a record
        return Compacted(record, 0)
    with held(ws / LOCK, timeout=0, what=f"gc of release {ws.name}", error=SeqclsError):
        data = json.dumps(build_record(ws, model), ensure_ascii=False, default=str, sort_keys=True)
        record.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(record, gzip.compress(data.encode("utf-8"), mtime=0))
        faults.point("gc:evidence-written")
        if not trash.take(ws):
            raise SeqclsError(f"{ws} is on another file system than gc's trash: its record written, it stays")
    return Compacted(record, freed)


__all__ = [
    "AUDIT_DIR",
    "Compacted",
    "Planned",
    "audit_path",
    "beyond_horizon",
    "build_record",
    "compact",
    "plan",
    "read_record",
    "records",
]
