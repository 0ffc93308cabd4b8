"""How much a model's releases hold on disk, by kind: what ``seqcls status`` shows and ``seqcls gc`` bounds."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from seqcls.contract.names import ModelName
from seqcls.release.kept import KEPT
from seqcls.release.workspace import FAILED_DIR, MANIFEST
from seqcls.settings import Settings

#: A workspace's heavy artifacts: the checkpoint snapshot, the static export, the ONNX graphs, a step's staging.
#: Everything else of it (manifest, reports, records: kilobytes) is its evidence and stays.
HEAVY = ("checkpoint", "static", "onnx", ".staging")
#: Where a model's compacted releases keep their audit record each (:mod:`seqcls.ops.evidence`).
AUDIT_DIR = ".audit"
AUDIT_SUFFIX = ".json.gz"


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (a file: its size), links not followed; 0 when it is gone."""
    try:
        st = path.lstat()
    except OSError:
        return 0
    if not path.is_dir() or path.is_symlink():
        return st.st_size
    total = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                        else:
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            continue
    return total


def megabytes(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def read_manifest(root: Path) -> dict[str, Any] | None:
    """A workspace's manifest; {} when it has none, None when it is unreadable (then nothing of it is collected)."""
    try:
        data = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def workspaces(settings: Settings, model: str) -> list[Path]:
    """Every release workspace of ``model`` (``<home>/releases/<model>/<fp16>/``)."""
    root = settings.releases_dir / model
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []


def audit_dir(settings: Settings, model: str) -> Path:
    """``<home>/releases/<model>/.audit/``: one compressed audit record per compacted release."""
    return settings.releases_dir / model / AUDIT_DIR


def evalset_refs(manifest: dict[str, Any] | None) -> set[str]:
    """The names of the kept eval-set copies (``<home>/evalsets/``) a workspace's manifest refers to."""
    kept = (manifest or {}).get(KEPT) or {}
    return {Path(str(e.get("copy"))).name for e in kept.values() if isinstance(e, dict) and e.get("copy")}


@dataclass
class DiskUse:
    """Bytes one model's releases hold, by kind."""

    workspaces: int = 0  # number of release workspaces
    heavy: int = 0
    failed: int = 0
    evidence: int = 0
    triton: int = 0
    evalsets: int = 0  # the eval-set copies its workspaces refer to (shared with other models)
    compacted: int = 0  # releases whose workspace went, compacted into one audit record each
    audit: int = 0  # bytes of those records

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def line(self) -> str:
        total, mb = self.heavy + self.failed + self.evidence, megabytes
        return (
            f"  disk: {mb(total)} in {self.workspaces} release workspaces (heavy {mb(self.heavy)}, failed/ "
            f"{mb(self.failed)}, evidence {mb(self.evidence)}); Triton repository {mb(self.triton)}; eval sets "
            f"{mb(self.evalsets)}"
            + (f"; {self.compacted} compacted releases' audit records {mb(self.audit)}" if self.compacted else "")
        )


def _entries(ws: Path) -> list[Path]:
    try:
        return list(ws.iterdir())
    except OSError:
        return []


def disk_use(settings: Settings, model: ModelName) -> DiskUse:
    """What ``model`` holds on disk now: its workspaces by kind, its Triton models, the eval sets it refers to."""
    use = DiskUse()
    refs: set[str] = set()
    for ws in workspaces(settings, model):
        use.workspaces += 1
        for entry in _entries(ws):  # each file walked once, counted by the top-level entry it is under
            size = tree_bytes(entry)
            if entry.name in HEAVY:
                use.heavy += size
            elif entry.name == FAILED_DIR:
                use.failed += size
            else:
                use.evidence += size
        refs |= evalset_refs(read_manifest(ws))
    audits = audit_dir(settings, model)
    for record in audits.glob(f"*{AUDIT_SUFFIX}") if audits.is_dir() else ():
        use.compacted += 1
        use.audit += tree_bytes(record)
    repo = Path(str(settings.triton_repository))
    use.triton = sum(tree_bytes(repo / m) for m in model.names.all)
    use.evalsets = sum(tree_bytes(settings.eval_sets_dir / r) for r in refs)
    return use


__all__ = [
    "AUDIT_DIR",
    "AUDIT_SUFFIX",
    "HEAVY",
    "DiskUse",
    "audit_dir",
    "disk_use",
    "evalset_refs",
    "megabytes",
    "read_manifest",
    "tree_bytes",
    "workspaces",
]
