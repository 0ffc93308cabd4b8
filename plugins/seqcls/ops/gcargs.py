"""``seqcls gc``'s command-line flags, each written beside what it steers (the CLI adds --home/--grpc/--json)."""

from __future__ import annotations

import argparse

from seqcls.contract.names import ModelName
from seqcls.settings import GC_MLFLOW_POLICIES

GC_HELP = (
    "retention: what release workspaces, failed/ leftovers, old releases' evidence (compacted), MLflow versions' "
    "artifacts and eval-set copies can go, and why the rest is kept; a dry run unless --apply"
)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 0, got {text!r}")
    return int(text)


def _bytes(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of bytes ≥ 1, got {text!r}")
    return int(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``seqcls gc``'s own flags (the CLI adds --home/--grpc/--json), written beside what they steer."""
    p.add_argument("--model-name", type=ModelName, default=None, help="one model (default: every model with releases)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", dest="apply", action="store_false", help="only say what would go (default)")
    mode.add_argument("--apply", dest="apply", action="store_true", help="collect it, under each model's lease")
    p.add_argument("--keep-refused", type=_count, default=None, metavar="N",
                   help="the newest N refused attempts per model keep their evidence (default "
                   "$SEQCLS_GC_KEEP_REFUSED or 5)")  # fmt: skip
    p.add_argument("--mlflow-versions", choices=GC_MLFLOW_POLICIES, default=None,
                   help="an MLflow version whose release workspace is collected: archive (delete its graphs, keep "
                   "the version, its tags and evidence), delete it, or keep it (default $SEQCLS_GC_MLFLOW_VERSIONS "
                   "or archive)")  # fmt: skip
    p.add_argument("--evidence-keep", type=_count, default=None, metavar="N",
                   help="the newest N releases per model keep their evidence as it is; older ones nothing "
                   "else keeps are compacted into one audit record each (default $SEQCLS_GC_EVIDENCE_KEEP "
                   "or 30)")  # fmt: skip
    p.add_argument("--statelog-rotate-bytes", type=_bytes, default=None, metavar="BYTES",
                   help="rotate a model's state log larger than this into a compressed segment and a snapshot "
                   "(default $SEQCLS_STATELOG_ROTATE_BYTES or 256000)")  # fmt: skip
    p.set_defaults(apply=False)


__all__ = ["GC_HELP", "add_arguments"]
