"""The checkpoint intake: validate a checkpoint directory in a fixed order and fingerprint it.

The common checks (the directory, links out of it, ``config.json``, labels, golden texts) are
here; what differs by framework — weights it may read, its tokenizer, the files that define the
model — is asked of the adapter :func:`seqcls.frameworks.detect` picks from ``config.json``. The
readers both use are :mod:`seqcls.checkpoints.checkpoint`. Cheap: no paddle or torch import.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from seqcls.checkpoints.checkpoint import (
    GOLDEN_FILE,
    LABEL_FILE,
    WEIGHT_FILES,
    Checkpoint,
    inside_checkpoint,
    num_labels_of,
    read_golden,
    read_json,
    read_labels,
    sha256_file,
    weights_path,
)
from seqcls.errors import CheckpointError
from seqcls.frameworks import FRAMEWORKS, Framework, detect

log = logging.getLogger(__name__)

#: Every model file any framework reads (a checkpoint's links are checked before its framework is known).
READ_FILES = tuple(dict.fromkeys(name for framework in FRAMEWORKS for name in framework.model_files))


def _checkpoint_root(path: str | Path) -> Path:
    root = Path(path).expanduser()
    if not root.exists():
        raise CheckpointError(f"{root}: checkpoint directory does not exist.")
    if not root.is_dir():
        raise CheckpointError(f"{root}: is not a directory; pass the directory save_pretrained wrote.")
    return root.resolve()


def _refuse_outside_links(root: Path, *, skip: frozenset[str] = frozenset()) -> None:
    """Every file seqcls reads from the checkpoint must be in it (a symlink to ``../x`` outside is refused)."""
    for name in (*READ_FILES, *WEIGHT_FILES, GOLDEN_FILE):
        if name not in skip:
            inside_checkpoint(root, name)


def _read_model_config(root: Path) -> tuple[dict, int]:
    """``config.json`` and its label count; refuses a model that is not a sequence classifier."""
    config = read_json(root / "config.json", "save_pretrained writes the model config there")
    num_labels = num_labels_of(config, root / "config.json")
    arch = config.get("architectures") or []
    if arch and not any("SequenceClassification" in a for a in arch):
        raise CheckpointError(
            f"{root / 'config.json'}: architectures {arch} is not a sequence classifier "
            "(expected e.g. ErnieForSequenceClassification)."
        )
    return config, num_labels


def _read_model_labels(label_path: Path, num_labels: int) -> tuple[str, ...]:
    labels = read_labels(label_path)
    if len(labels) != num_labels:
        raise CheckpointError(
            f"{label_path}: {len(labels)} labels but config.json says the model has {num_labels} "
            "(num_labels); the label file must list exactly one line per output."
        )
    return labels


def _hash_model_files(root: Path, label_path: Path, weights: Path, framework: Framework) -> tuple[dict[str, str], str]:
    """sha256 of every model-defining file present, and the fingerprint over them."""
    files: dict[str, str] = {}
    for name in framework.model_files:
        p = label_path if name == LABEL_FILE else root / name
        if p.exists():
            files[name] = sha256_file(p)
    files[weights.name] = sha256_file(weights)
    fingerprint = hashlib.sha256("\n".join(f"{k}={v}" for k, v in sorted(files.items())).encode()).hexdigest()
    return files, fingerprint


def resolve_checkpoint(
    path: str | Path,
    *,
    label_file: str | Path | None = None,
    golden_file: str | Path | None = None,
    allow_unsafe_pickle: bool = False,
) -> Checkpoint:
    """Validate a checkpoint directory and fingerprint it (sha256 over the model-defining files)."""
    root = _checkpoint_root(path)
    given = ((LABEL_FILE, label_file), (GOLDEN_FILE, golden_file))  # files given explicitly may live anywhere
    _refuse_outside_links(root, skip=frozenset(name for name, file in given if file))
    config, num_labels = _read_model_config(root)
    framework = detect(config, root / "config.json")
    intake = framework.check_checkpoint(root, config, allow_unsafe_pickle=allow_unsafe_pickle)
    weights, vocab_size = intake.weights, intake.vocab_size
    label_path = Path(label_file).expanduser().resolve() if label_file else root / LABEL_FILE
    labels = _read_model_labels(label_path, num_labels)
    golden_path = Path(golden_file).expanduser().resolve() if golden_file else root / GOLDEN_FILE
    golden = read_golden(golden_path) if (golden_file or golden_path.exists()) else None
    files, fingerprint = _hash_model_files(root, label_path, weights, framework)

    ckpt = Checkpoint(
        path=root,
        weights=weights,
        labels=labels,
        num_labels=num_labels,
        vocab_size=vocab_size,
        do_lower_case=intake.do_lower_case,
        max_position_embeddings=int(config.get("max_position_embeddings", 512)),
        fingerprint=fingerprint,
        files=files,
        golden_texts=golden,
        golden_sha256=sha256_file(golden_path) if golden else None,
        framework=framework.name,
        architecture=str((config.get("architectures") or [""])[0]),
    )
    log.info(
        "checkpoint %s (%s %s): %d labels, vocab %d, weights %s (%.1f MB), fingerprint %s",
        root,
        framework.name,
        ckpt.architecture or "?",
        num_labels,
        vocab_size,
        weights.name,
        weights.stat().st_size / 1e6,
        ckpt.short_fingerprint,
    )
    return ckpt


def directory_fingerprint(path: str | Path) -> str:
    """The fingerprint :func:`resolve_checkpoint` gives ``path`` (with its own ``label.txt``), hashing only."""
    root = _checkpoint_root(path)
    _refuse_outside_links(root)
    config = read_json(root / "config.json", "save_pretrained writes the model config there")
    framework = detect(config, root / "config.json")
    return _hash_model_files(root, root / LABEL_FILE, weights_path(root), framework)[1]
