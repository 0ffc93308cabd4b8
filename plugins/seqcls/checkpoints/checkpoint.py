"""Find and validate a trained checkpoint before any heavy work; fingerprint it.

A checkpoint is a directory as PaddleNLP's ``save_pretrained`` writes it (``config.json``,
``model_state.pdparams`` or ``model.safetensors``, ``vocab.txt``, ``tokenizer_config.json``) — or
as Hugging Face ``transformers``' does (``config.json`` with ``problem_type:
multi_label_classification``, ``model.safetensors``, ``tokenizer.json`` and/or ``vocab.txt``,
``tokenizer_config.json``); which framework wrote it is read from ``config.json``
(:func:`detect_framework`) — plus ``label.txt`` (one label per line, hierarchy joined with ``##``) and optionally
``golden.txt`` (one text per line: the texts the release is validated and smoke-tested on).
Everything checked here is cheap (no paddle import), so a bad checkpoint fails in seconds with a
message naming the file, instead of minutes later inside an export. Text files may be saved with
CRLF line endings, and the label and golden files with a UTF-8 byte-order mark; every file read
from the directory must be in it (a symlink resolving outside the checkpoint is refused).
Which checkpoint ``latest`` is — the one its training job marked complete last — is
:mod:`seqcls.checkpoints.completion`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from seqcls.errors import CheckpointError
from seqcls.checkpoints.safeload import check_weight_file, scan_pickle

log = logging.getLogger(__name__)

WEIGHT_FILES = ("model_state.pdparams", "model.safetensors")
LABEL_FILE = "label.txt"
GOLDEN_FILE = "golden.txt"
#: Files whose bytes define the released model; their hashes make the fingerprint.
MODEL_FILES = ("config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json", LABEL_FILE)
REQUIRED_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[UNK]")
BOM = "\ufeff"
WORDPIECE_TOKENIZERS = {"ErnieTokenizer", "BertTokenizer", "ErnieTokenizerFast", "BertTokenizerFast"}
FRAMEWORKS = ("paddle", "transformers")


@dataclass(frozen=True)
class Checkpoint:
    """A validated checkpoint: where its files are and what the release needs to know."""

    path: Path
    weights: Path
    labels: tuple[str, ...]
    num_labels: int
    vocab_size: int
    do_lower_case: bool
    max_position_embeddings: int
    fingerprint: str
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    golden_texts: tuple[str, ...] | None = None
    golden_sha256: str | None = None
    framework: str = "paddle"  # "paddle" (PaddleNLP) or "transformers" (Hugging Face PyTorch)
    architecture: str = ""

    @property
    def vocab_file(self) -> Path:
        return self.path / "vocab.txt"

    @property
    def is_transformers(self) -> bool:
        return self.framework == "transformers"

    @property
    def label_file(self) -> Path:
        return self.path / LABEL_FILE

    @property
    def short_fingerprint(self) -> str:
        return self.fingerprint[:16]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        d["weights"] = str(self.weights)
        d["labels"] = list(self.labels)
        d["golden_texts"] = None if self.golden_texts is None else len(self.golden_texts)
        return d


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _read_text(path: Path, what: str) -> str:
    if not path.exists():
        raise CheckpointError(f"{path}: missing — {what}.")
    if not path.is_file():
        raise CheckpointError(f"{path}: is not a regular file — {what}.")
    try:
        return path.read_text(encoding="utf-8")
    except PermissionError as exc:
        raise CheckpointError(f"{path}: not readable ({exc.strerror}); fix its permissions.") from exc
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}).") from exc
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc.strerror}).") from exc


def _read_lines(path: Path, what: str) -> list[str]:
    """The lines of a text file without line endings (LF, CRLF) or a leading UTF-8 byte-order mark."""
    return _read_text(path, what).removeprefix(BOM).splitlines()


def inside_checkpoint(root: Path, name: str) -> Path:
    """``root / name``, refused when it is a symlink resolving outside the (resolved) checkpoint ``root``."""
    path = root / name
    if not path.is_symlink():
        return path
    try:
        target = path.resolve()
    except (OSError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: symlink cannot be resolved ({exc}).") from exc
    if not target.is_relative_to(root):
        raise CheckpointError(
            f"{path}: is a symlink to {target}, outside the checkpoint directory {root}; a checkpoint must "
            "hold its own files — copy the file in (cp --dereference) instead of linking to it."
        )
    return path


def read_json(path: Path, what: str) -> dict:
    """A JSON object from ``path``; any problem is a CheckpointError naming the file."""
    text = _read_text(path, what)
    if text.startswith(BOM):
        raise CheckpointError(
            f"{path}: starts with a UTF-8 byte-order mark, which PaddleNLP's JSON reader refuses; "
            "save it without the BOM."
        )
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}.") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(data).__name__}.")
    return data


def num_labels_of(config: dict, path: Path) -> int:
    """``num_labels`` as PaddleNLP derives it (explicit key, else ``id2label``, else ``num_classes``)."""
    for key in ("num_labels", "num_classes"):
        if isinstance(config.get(key), int):
            return int(config[key])
    if isinstance(config.get("id2label"), dict) and config["id2label"]:
        return len(config["id2label"])
    raise CheckpointError(
        f"{path}: cannot tell the number of labels (no num_labels, id2label or num_classes); "
        "is this a sequence-classification checkpoint?"
    )


def read_labels(path: Path) -> tuple[str, ...]:
    """Labels from a label file: one per line, trailing blank lines ignored, no duplicates."""
    lines = _read_lines(path, "the label file lists one label per line")
    while lines and not lines[-1].strip():
        lines.pop()
    labels = tuple(line.strip() for line in lines)
    if not labels:
        raise CheckpointError(f"{path}: label file is empty; write one label per line.")
    for i, lbl in enumerate(labels, start=1):
        if not lbl:
            raise CheckpointError(f"{path}: line {i} is blank; every line must name a label.")
    seen: set[str] = set()
    for i, lbl in enumerate(labels, start=1):
        if lbl in seen:
            raise CheckpointError(f"{path}: line {i}: label {lbl!r} appears twice.")
        seen.add(lbl)
    return labels


def read_golden(path: Path) -> tuple[str, ...]:
    texts = tuple(t for t in _read_lines(path, "golden texts, one per line") if t.strip())
    if not texts:
        raise CheckpointError(f"{path}: golden text file has no texts; remove it or add texts.")
    return texts


def _checkpoint_root(path: str | Path) -> Path:
    root = Path(path).expanduser()
    if not root.exists():
        raise CheckpointError(f"{root}: checkpoint directory does not exist.")
    if not root.is_dir():
        raise CheckpointError(f"{root}: is not a directory; pass the directory save_pretrained wrote.")
    return root.resolve()


def _refuse_outside_links(root: Path, *, skip: frozenset[str] = frozenset()) -> None:
    """Every file seqcls reads from the checkpoint must be in it (a symlink to ``../x`` outside is refused)."""
    from seqcls.checkpoints.transformers import HF_MODEL_FILES

    for name in (*HF_MODEL_FILES, *WEIGHT_FILES, GOLDEN_FILE):
        if name not in skip:
            inside_checkpoint(root, name)


def detect_framework(config: dict, path: Path) -> str:
    """Which library saved the checkpoint, from the key each one's ``save_pretrained`` writes into
    ``config.json`` (``transformers_version`` / ``paddlenlp_version``); a config with neither is
    PaddleNLP's older format (seqcls's default), one with both is refused."""
    hf, paddle = "transformers_version" in config, "paddlenlp_version" in config
    if hf and paddle:
        raise CheckpointError(
            f"{path}: has both transformers_version and paddlenlp_version, so seqcls cannot tell which "
            "framework saved it; remove the key of the library that did not write this checkpoint."
        )
    return "transformers" if hf else "paddle"


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


#: What PaddleNLP's ``from_pretrained`` would load *instead of* the single weights file seqcls
#: scans and fingerprints: it prefers a shard index (whose shards it unpickles unscanned) over
#: ``model_state.pdparams``, and ``model.safetensors`` over both.
SHADOWING_FILES = ("model.safetensors.index.json", "model_state.pdparams.index.json", "pytorch_model.bin.index.json")


def _weights_path(root: Path) -> Path:
    present = [w for w in WEIGHT_FILES if (root / w).exists() or (root / w).is_symlink()]
    if not present:
        raise CheckpointError(f"{root}: no weights — expected one of {', '.join(WEIGHT_FILES)}.")
    if len(present) > 1:
        raise CheckpointError(
            f"{root}: both {' and '.join(present)} — PaddleNLP would load model.safetensors while the release "
            "records the other; keep one (model.safetensors preferred)."
        )
    shadows = [name for name in SHADOWING_FILES if (root / name).exists() or (root / name).is_symlink()]
    if shadows:
        raise CheckpointError(
            f"{root / shadows[0]}: a sharded-weights index; PaddleNLP would load its shards instead of "
            f"{present[0]} (unscanned, and not what the release fingerprints). seqcls releases one weights file: "
            "save with save_pretrained(..., max_shard_size large enough) or remove the index."
        )
    return root / present[0]


def _find_weights(root: Path, allow_unsafe_pickle: bool = False, framework: str = "paddle") -> Path:
    if framework == "transformers":
        from seqcls.checkpoints.transformers import refuse_other_weights

        refuse_other_weights(root)
    weights = _weights_path(root)
    check_weight_file(weights)
    if weights.suffix == ".pdparams":
        # a pickle: refuse any global but arrays before paddle ever unpickles it
        scan_pickle(weights, allow_unsafe=allow_unsafe_pickle)
    return weights


def _read_do_lower_case(root: Path) -> bool:
    """``do_lower_case`` from ``tokenizer_config.json``; refuses a non-WordPiece tokenizer."""
    tok_cfg = read_json(root / "tokenizer_config.json", "save_pretrained writes the tokenizer config there")
    tok_class = tok_cfg.get("tokenizer_class")
    if tok_class and tok_class not in WORDPIECE_TOKENIZERS:
        raise CheckpointError(
            f"{root / 'tokenizer_config.json'}: tokenizer_class {tok_class!r} is not supported; "
            f"seqcls serves WordPiece vocabularies ({', '.join(sorted(WORDPIECE_TOKENIZERS))})."
        )
    return bool(tok_cfg.get("do_lower_case", True))


def _read_vocab(root: Path, config: dict) -> list[str]:
    """The WordPiece vocabulary: non-empty, with the special tokens, no larger than the embeddings."""
    vocab_path = root / "vocab.txt"
    text = _read_text(vocab_path, "the WordPiece vocabulary")
    if text.startswith(BOM):  # CRLF is fine: PaddleNLP and the serving tokenizer both drop it
        raise CheckpointError(
            f"{vocab_path}: starts with a UTF-8 byte-order mark, which PaddleNLP and the serving tokenizer "
            f"would read as part of the first token ({text.splitlines()[0]!r}); save it without the BOM."
        )
    vocab = [t for t in text.splitlines() if t.strip()]
    if not vocab:
        raise CheckpointError(f"{vocab_path}: vocabulary is empty.")
    missing = [t for t in REQUIRED_TOKENS if t not in vocab]
    if missing:
        raise CheckpointError(f"{vocab_path}: special tokens missing: {', '.join(missing)}.")
    vocab_size = int(config.get("vocab_size", len(vocab)))
    if len(vocab) > vocab_size:
        raise CheckpointError(
            f"{vocab_path}: {len(vocab)} tokens but config.json vocab_size is {vocab_size}; "
            "ids past the embedding table would crash the model — use the vocab it was trained with."
        )
    return vocab


def _read_model_labels(label_path: Path, num_labels: int) -> tuple[str, ...]:
    labels = read_labels(label_path)
    if len(labels) != num_labels:
        raise CheckpointError(
            f"{label_path}: {len(labels)} labels but config.json says the model has {num_labels} "
            "(num_labels); the label file must list exactly one line per output."
        )
    return labels


def _hash_model_files(
    root: Path, label_path: Path, weights: Path, framework: str = "paddle"
) -> tuple[dict[str, str], str]:
    """sha256 of every model-defining file present, and the fingerprint over them."""
    files: dict[str, str] = {}
    from seqcls.checkpoints.transformers import HF_MODEL_FILES

    for name in HF_MODEL_FILES if framework == "transformers" else MODEL_FILES:
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
    from seqcls.checkpoints import transformers as checkpoint_hf
    root = _checkpoint_root(path)
    given = ((LABEL_FILE, label_file), (GOLDEN_FILE, golden_file))  # files given explicitly may live anywhere
    _refuse_outside_links(root, skip=frozenset(name for name, file in given if file))
    config, num_labels = _read_model_config(root)
    framework = detect_framework(config, root / "config.json")
    if framework == "transformers":
        checkpoint_hf.check_config(config, root / "config.json")
    weights = _find_weights(root, allow_unsafe_pickle, framework)
    if framework == "transformers":
        do_lower_case, vocab_size = checkpoint_hf.read_tokenizer(root, config)
    else:
        do_lower_case = _read_do_lower_case(root)
        vocab_size = len(_read_vocab(root, config))
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
        do_lower_case=do_lower_case,
        max_position_embeddings=int(config.get("max_position_embeddings", 512)),
        fingerprint=fingerprint,
        files=files,
        golden_texts=golden,
        golden_sha256=sha256_file(golden_path) if golden else None,
        framework=framework,
        architecture=str((config.get("architectures") or [""])[0]),
    )
    log.info(
        "checkpoint %s (%s %s): %d labels, vocab %d, weights %s (%.1f MB), fingerprint %s",
        root,
        framework,
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
    framework = detect_framework(config, root / "config.json")
    return _hash_model_files(root, root / LABEL_FILE, _weights_path(root), framework)[1]
