"""A trained checkpoint: its record (:class:`Checkpoint`) and the cheap readers its checks share.

A checkpoint is a directory as PaddleNLP's ``save_pretrained`` writes it (``config.json``, or
``model_config.json`` as PaddleNLP 2.x named it, ``model_state.pdparams`` or ``model.safetensors``,
``vocab.txt``, ``tokenizer_config.json``) — or
as Hugging Face ``transformers``' does (``config.json`` with ``problem_type:
multi_label_classification``, ``model.safetensors``, ``tokenizer.json`` and/or ``vocab.txt``,
``tokenizer_config.json``); which framework wrote it is read from ``config.json``
(:func:`seqcls.frameworks.detect`) — plus ``label.txt`` (one label per line, hierarchy joined with
``##``) and optionally ``golden.txt`` (one text per line: the texts the release is validated and
smoke-tested on). Everything read here is cheap (no paddle import), so a bad checkpoint fails in
seconds with a message naming the file, instead of minutes later inside an export. Text files may
be saved with CRLF line endings, and the label and golden files with a UTF-8 byte-order mark; every
file read from the directory must be in it (a symlink resolving outside the checkpoint is refused).
The intake that runs the checks in order is :mod:`seqcls.release.intake`; the checks that
differ by framework are the adapters' (:mod:`seqcls.frameworks`). Which checkpoint ``latest`` is —
the one its training job marked complete last — is :mod:`seqcls.release.completion`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import seqcls_contract

from seqcls.checkpoints.safeload import check_weight_file, scan_pickle
from seqcls.checkpoints.torchload import TORCH_INDEX, TORCH_WEIGHTS, scan_torch_file, shard_files
from seqcls.errors import CheckpointError

WEIGHT_FILES = ("model_state.pdparams", "model.safetensors")
LABEL_FILE = "label.txt"
GOLDEN_FILE = "golden.txt"
CONFIG_FILE = "config.json"
#: Where PaddleNLP 2.x (to 2.5) saved the model config; PaddleNLP 3 still reads it when config.json is absent.
LEGACY_CONFIG_FILE = "model_config.json"
#: ModelScope's model descriptor (its pipeline and task, not the model's architecture).
MODELSCOPE_FILE = "configuration.json"
#: Files whose bytes define the released model; their hashes make the fingerprint.
MODEL_FILES = (
    CONFIG_FILE,
    LEGACY_CONFIG_FILE,
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    LABEL_FILE,
)
#: Weights files of other libraries (pickles): an adapter refuses them or ignores them, by name.
OTHER_WEIGHT_FILES = ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack")
REQUIRED_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[UNK]")
#: The longest text the server accepts (the serving contract's); a longer golden text is refused at intake.
MAX_TEXT_BYTES: int = seqcls_contract.MAX_TEXT_BYTES
BOM = "\ufeff"


@dataclass(frozen=True)
class Checkpoint:
    """A validated checkpoint: where its files are and what the release needs to know.

    In a release ``path`` is the workspace's snapshot (:mod:`seqcls.checkpoints.snapshot`), the only
    place a step reads checkpoint files from, and ``source`` the operator's directory it was taken
    from (for messages and lineage: :attr:`origin`); resolved in place, ``source`` is None.
    """

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
    framework: str = "paddle"  # the adapter's name (seqcls.frameworks): "paddle" (PaddleNLP) or "transformers"
    architecture: str = ""
    source: Path | None = None
    #: ``weights`` was converted at intake (``pytorch_model.bin`` -> ``model.safetensors``): what from, how
    #: (:meth:`seqcls.checkpoints.torchload.Conversion.to_dict`); the fingerprint is over the files it came as.
    converted: dict | None = None

    @property
    def origin(self) -> Path:
        """The operator's checkpoint directory (what messages, lineage and XCom name)."""
        return self.source or self.path

    @property
    def config_file(self) -> Path:
        """The model config the checkpoint came with: ``config.json``, or PaddleNLP 2.x's ``model_config.json``."""
        legacy = LEGACY_CONFIG_FILE in self.files and CONFIG_FILE not in self.files
        return self.path / (LEGACY_CONFIG_FILE if legacy else CONFIG_FILE)

    @property
    def vocab_file(self) -> Path:
        return self.path / "vocab.txt"

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
        d["source"] = str(self.origin)
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


def config_file(root: Path) -> Path:
    """The model config of the checkpoint at ``root``: ``config.json``, else PaddleNLP 2.x's ``model_config.json``.

    Both present is fine when their bytes are equal (a copy kept for old readers); when they differ,
    PaddleNLP 3 would read one and an older release the other, so the checkpoint is refused."""
    new, legacy = inside_checkpoint(root, CONFIG_FILE), inside_checkpoint(root, LEGACY_CONFIG_FILE)
    if new.is_file() and legacy.is_file():
        if new.read_bytes() != legacy.read_bytes():
            raise CheckpointError(
                f"{new} and {legacy}: both present and different — PaddleNLP 3 reads {CONFIG_FILE}, PaddleNLP 2.x "
                f"{LEGACY_CONFIG_FILE}, so which model this is depends on who loads it; keep the one the training "
                "job wrote."
            )
        return new
    if legacy.exists():
        return legacy
    if not new.exists() and (root / MODELSCOPE_FILE).exists():
        raise CheckpointError(
            f"{root / MODELSCOPE_FILE}: a ModelScope model descriptor, and no {CONFIG_FILE} — a classifier release "
            f"needs the model's own config ({CONFIG_FILE} from save_pretrained: architectures, num_labels or "
            "id2label, problem_type multi_label_classification), its weights (model.safetensors or "
            "pytorch_model.bin), its tokenizer files and label.txt; save the fine-tuned model with "
            "save_pretrained into this directory."
        )
    return new


def flatten_legacy_config(config: dict, path: Path) -> dict:
    """PaddleNLP 2.x's nested ``model_config.json`` as the flat config later versions write.

    Before its models had config classes, PaddleNLP saved a model's ``__init__`` arguments: the base
    model's configuration as a positional argument (``init_args: [{..., "init_class": "ErnieModel"}]``)
    or a keyword one, the head's own keywords (``num_classes``) beside, and the class as ``init_class``.
    The base model's keys are lifted to the top (the head's win), ``init_class`` becomes
    ``architectures`` — as PaddleNLP 3 reads such a file. A flat config is returned unchanged."""
    if "init_args" not in config and "init_class" not in config:
        return config
    init_args = config.get("init_args", [])
    if not isinstance(init_args, list):
        raise CheckpointError(f"{path}: init_args is {type(init_args).__name__}; PaddleNLP 2.x wrote a list.")
    bases = [a for a in init_args if isinstance(a, dict)]
    flat = {}
    for key, value in config.items():
        if key in ("init_args", "init_class"):
            continue
        if isinstance(value, dict) and "init_class" in value:  # the base model passed by keyword
            bases.append(value)
        else:
            flat[key] = value
    for base in bases:
        for key, value in flatten_legacy_config(base, path).items():
            if key != "architectures":
                flat.setdefault(key, value)
    if isinstance(config.get("init_class"), str):
        flat["architectures"] = [config["init_class"]]
    return flat


def read_model_config(root: Path) -> tuple[dict, Path]:
    """The checkpoint's model config (flat, whatever version wrote it) and the file it was read from."""
    path = config_file(root)
    config = read_json(path, "save_pretrained writes the model config there")
    return (flatten_legacy_config(config, path) if path.name == LEGACY_CONFIG_FILE else config), path


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


def read_golden(path: Path, max_bytes: int = MAX_TEXT_BYTES) -> tuple[str, ...]:
    """The golden texts (one per line, blank lines skipped); a text the server would refuse is refused here,
    before any heavy step, rather than at smoke after register and publish."""
    lines = _read_lines(path, "golden texts, one per line")
    for i, line in enumerate(lines, start=1):
        if (size := len(line.encode("utf-8"))) > max_bytes:
            raise CheckpointError(
                f"{path}: line {i} is {size} bytes, longer than the {max_bytes} bytes the server accepts for one text "
                "(the serving contract's MAX_TEXT_BYTES; it would be refused at smoke, after register and publish) "
                "— shorten it or remove that line."
            )
    texts = tuple(t for t in lines if t.strip())
    if not texts:
        raise CheckpointError(f"{path}: golden text file has no texts; remove it or add texts.")
    return texts


#: What PaddleNLP's ``from_pretrained`` would load *instead of* the single weights file seqcls
#: scans and fingerprints: it prefers a shard index (whose shards it unpickles unscanned) over
#: ``model_state.pdparams``, and ``model.safetensors`` over both.
SHADOWING_FILES = ("model.safetensors.index.json", "model_state.pdparams.index.json", "pytorch_model.bin.index.json")


def weights_path(root: Path) -> Path:
    """The one weights file of the checkpoint; refused when PaddleNLP would load another (or shards).

    Without ``model_state.pdparams`` or ``model.safetensors``, PyTorch's ``pytorch_model.bin`` (or its
    shard index) is the weights file — a transformers checkpoint's, converted at intake."""
    present = [w for w in WEIGHT_FILES if (root / w).exists() or (root / w).is_symlink()]
    if not present:
        torch_files = [n for n in (TORCH_WEIGHTS, TORCH_INDEX) if (root / n).exists() or (root / n).is_symlink()]
        if len(torch_files) > 1:
            raise CheckpointError(
                f"{root}: both {TORCH_WEIGHTS} and {TORCH_INDEX} — transformers would load {TORCH_WEIGHTS} and ignore "
                "the shards the index lists; keep the files of one save."
            )
        if torch_files:
            return root / torch_files[0]
        raise CheckpointError(
            f"{root}: no weights — expected one of {', '.join(WEIGHT_FILES)} (or, for a transformers checkpoint, "
            f"{TORCH_WEIGHTS} or sharded pytorch_model-*.bin with {TORCH_INDEX})."
        )
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


def is_torch_pickle(weights: Path) -> bool:
    """Whether ``weights`` is PyTorch's pickled format (converted to safetensors at intake)."""
    return weights.name in (TORCH_WEIGHTS, TORCH_INDEX)


def weight_files(weights: Path) -> list[Path]:
    """Every file the weights are made of: the file itself, or a shard index and the shards it lists."""
    if weights.name != TORCH_INDEX:
        return [weights]
    root = weights.parent
    shards = []
    for name in shard_files(weights):
        shard = inside_checkpoint(root, name)
        if not shard.is_file():
            raise CheckpointError(f"{shard}: missing — {weights} lists it as a shard of the model's weights.")
        shards.append(shard)
    return [weights, *shards]


def find_weights(root: Path, allow_unsafe_pickle: bool = False, *, torch_pickles: bool = False) -> Path:
    """:func:`weights_path`, its file checked, and a pickle scanned before anything unpickles it.

    ``torch_pickles``: the framework reads PyTorch's ``pytorch_model.bin`` (scanned statically here,
    loaded only by PyTorch's restricted unpickler at intake); otherwise such a file is refused."""
    weights = weights_path(root)
    if is_torch_pickle(weights):
        if not torch_pickles:
            raise CheckpointError(
                f"{weights}: PyTorch weights in a PaddleNLP checkpoint; PaddleNLP releases read model_state.pdparams "
                "or model.safetensors — save the model with PaddleNLP's save_pretrained."
            )
        for path in weight_files(weights):
            if path.name != TORCH_INDEX:
                if path.stat().st_size == 0:
                    raise CheckpointError(f"{path}: weight file is empty; copy the checkpoint again.")
                scan_torch_file(path)
        return weights
    check_weight_file(weights)
    if weights.suffix == ".pdparams":
        # a pickle: refuse any global but arrays before paddle ever unpickles it
        scan_pickle(weights, allow_unsafe=allow_unsafe_pickle)
    return weights


def read_vocab(root: Path, config: dict, config_name: str = CONFIG_FILE) -> list[str]:
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
            f"{vocab_path}: {len(vocab)} tokens but {config_name} vocab_size is {vocab_size}; "
            "ids past the embedding table would crash the model — use the vocab it was trained with."
        )
    return vocab
