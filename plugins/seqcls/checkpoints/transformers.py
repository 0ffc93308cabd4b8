"""The checks a Hugging Face ``transformers`` checkpoint gets up front, besides the common ones.

:mod:`seqcls.checkpoints.checkpoint` detects the framework (``config.json``'s ``transformers_version``) and
calls these: a multi-label ``*ForSequenceClassification`` (sigmoid per label), weights from
``model.safetensors`` only (``pytorch_model.bin`` is a pickle), and a tokenizer Triton can serve
(``tokenizer.json``, or the slow tokenizer's vocabulary it is converted from at export) whose ids
fit the embedding table. Cheap: no torch import.
"""

from __future__ import annotations

from pathlib import Path

from seqcls.checkpoints.checkpoint import MODEL_FILES, _read_vocab, read_json
from seqcls.errors import CheckpointError

#: Tokenizer files a ``transformers`` checkpoint may carry (fingerprinted when present): the fast
#: tokenizer's ``tokenizer.json`` (what Triton serves) and the slow tokenizer's vocabulary.
SLOW_TOKENIZER_FILES = ("vocab.txt", "spm.model", "sentencepiece.bpe.model", "tokenizer.model")
HF_TOKENIZER_FILES = ("tokenizer.json", *SLOW_TOKENIZER_FILES)
HF_MODEL_FILES = (*MODEL_FILES, *(n for n in HF_TOKENIZER_FILES if n not in MODEL_FILES), "added_tokens.json")
#: What ``transformers`` would read instead of (or besides) ``model.safetensors``: pickles.
HF_PICKLE_WEIGHTS = ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack")


def check_config(config: dict, path: Path) -> None:
    """A ``transformers`` classifier seqcls can serve: multi-label (sigmoid per label), known architecture."""
    arch = config.get("architectures") or []
    if not arch:
        raise CheckpointError(
            f"{path}: no architectures; save the model with save_pretrained (it records e.g. "
            "BertForSequenceClassification)."
        )
    problem = config.get("problem_type")
    if problem != "multi_label_classification":
        raise CheckpointError(
            f"{path}: problem_type is {problem!r}; seqcls serves multi-label classifiers (a sigmoid per label, "
            "thresholded) — train with problem_type='multi_label_classification' (the model then uses "
            "BCEWithLogitsLoss) or set it in config.json if that is how the model was trained."
        )


def refuse_other_weights(root: Path) -> None:
    """Weights transformers could read besides ``model.safetensors`` are refused (pickles, Paddle's)."""
    pickles = [n for n in HF_PICKLE_WEIGHTS if (root / n).exists() or (root / n).is_symlink()]
    if pickles:
        raise CheckpointError(
            f"{root / pickles[0]}: seqcls releases transformers checkpoints from model.safetensors only "
            f"({pickles[0]} is read by pickle, which can run code); re-save with "
            "save_pretrained(..., safe_serialization=True) and remove it."
        )
    if (root / "model_state.pdparams").exists():
        raise CheckpointError(
            f"{root / 'model_state.pdparams'}: a PaddlePaddle weights file in a transformers checkpoint "
            "(config.json has transformers_version); keep model.safetensors only."
        )


def refuse_outside_files(root: Path, tok_cfg: dict) -> None:
    """transformers passes a ``*_file`` key of ``tokenizer_config.json`` (``vocab_file``,
    ``tokenizer_file``, ``merges_file``...) to the tokenizer as it is, so a config naming
    ``/elsewhere/vocab.txt`` makes it read that file instead of the checkpoint's. Only files
    inside the checkpoint directory are allowed (``save_pretrained`` writes none of these keys)."""
    for key, value in tok_cfg.items():
        if not key.endswith("_file") or value is None:
            continue
        target = (root / str(value)).resolve() if isinstance(value, str) else None
        if target is None or not target.is_relative_to(root):
            raise CheckpointError(
                f"{root / 'tokenizer_config.json'}: {key} names {value!r}, outside the checkpoint {root}; "
                f"transformers would read it instead of the checkpoint's own file — remove the {key} key "
                "(save_pretrained does not write it)."
            )


def read_tokenizer(root: Path, config: dict) -> tuple[bool, int]:
    """``(do_lower_case, vocabulary size)`` of a transformers checkpoint's tokenizer, cheaply checked.

    The Triton tokenizer serves ``tokenizer.json`` (built from the slow tokenizer's files at export
    when the checkpoint has none); the parity gate proves it gives the ids ``transformers`` does.
    """
    tok_cfg = read_json(root / "tokenizer_config.json", "save_pretrained writes the tokenizer config there")
    refuse_outside_files(root, tok_cfg)
    present = [n for n in HF_TOKENIZER_FILES if (root / n).is_file()]
    if not present:
        raise CheckpointError(
            f"{root}: no tokenizer — expected tokenizer.json (a fast tokenizer's save_pretrained) or the slow "
            f"tokenizer's vocabulary ({', '.join(SLOW_TOKENIZER_FILES)})."
        )
    vocab_size = int(config.get("vocab_size", 0)) or None
    size = 0
    if (root / "tokenizer.json").is_file():
        data = read_json(root / "tokenizer.json", "a fast tokenizer's save_pretrained writes it")
        model = data.get("model")
        if not isinstance(model, dict) or "vocab" not in model:
            raise CheckpointError(f"{root / 'tokenizer.json'}: no model.vocab; is this a tokenizers file?")
        vocab = model["vocab"]
        ids = vocab.values() if isinstance(vocab, dict) else range(len(vocab))
        added = [t.get("id", 0) for t in data.get("added_tokens") or [] if isinstance(t, dict)]
        size = max([*ids, *added], default=-1) + 1
    elif (root / "vocab.txt").is_file():
        size = len(_read_vocab(root, config))
    if vocab_size is not None and size > vocab_size:
        raise CheckpointError(
            f"{root / present[0]}: ids up to {size - 1} but config.json vocab_size is {vocab_size}; ids past the "
            "embedding table would crash the model — use the tokenizer it was trained with."
        )
    return bool(tok_cfg.get("do_lower_case", True)), size
