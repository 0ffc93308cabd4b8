"""Build small, real Hugging Face PyTorch classifiers (DeBERTa-v2, BERT) without downloading anything.

The HF twin of :mod:`seqcls_tools.testing`: a Chinese WordPiece vocabulary from the texts at
hand, a randomly initialised ``*ForSequenceClassification`` with ``problem_type:
multi_label_classification`` and ``id2label`` set, saved exactly as a ``transformers`` training
job's ``save_pretrained`` writes it (``config.json``, ``model.safetensors``, ``tokenizer.json`` +
``vocab.txt`` + ``tokenizer_config.json``), plus ``label.txt``, optional golden texts and the
completion marker. DeBERTa-v2 is the architecture of the second seed document's model
(``nlp_deberta_rex-uninlu_chinese-base`` also ships a WordPiece ``vocab.txt``); BERT is what
most teams hold. Needs the ``torch`` extra.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from seqcls_tools.testing import TINY_CORPUS, TINY_LABELS, build_vocab, pad_vocab

log = logging.getLogger(__name__)

ARCHITECTURES = ("deberta-v2", "bert")


def _config(
    architecture: str,
    *,
    vocab_size: int,
    labels: Sequence[str],
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    max_position: int,
):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=hidden_size * 4,
        max_position_embeddings=max_position,
        pad_token_id=0,
        problem_type="multi_label_classification",
        id2label={i: label for i, label in enumerate(labels)},
        label2id={label: i for i, label in enumerate(labels)},
    )
    if architecture == "deberta-v2":
        from transformers import DebertaV2Config

        # the base model's attention: disentangled relative positions (c2p + p2c), no absolute positions
        return DebertaV2Config(
            **common,
            type_vocab_size=0,
            relative_attention=True,
            position_buckets=32,
            max_relative_positions=-1,
            pos_att_type=["p2c", "c2p"],
            position_biased_input=False,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
        )
    if architecture == "bert":
        from transformers import BertConfig

        return BertConfig(**common, type_vocab_size=2)
    raise ValueError(f"architecture {architecture!r}; expected one of {ARCHITECTURES}")


def build_tiny_hf_checkpoint(
    out_dir: Path,
    *,
    architecture: str = "bert",
    labels: Sequence[str] = TINY_LABELS,
    seed: int = 0,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    max_position: int = 160,
    corpus: Sequence[str] = TINY_CORPUS,
    golden: Sequence[str] | None = None,
    logit_scale: float = 1.0,
    vocab_size: int | None = None,
    complete: bool = True,
    safe_serialization: bool = True,
    max_shard_size: str | None = None,
) -> Path:
    """A randomly initialised tiny HF classifier of ``architecture`` saved as a real checkpoint directory.

    ``logit_scale`` multiplies the classifier weights (stable decisions, as a trained model's);
    ``vocab_size`` pads the vocabulary with ``[unusedN]`` tokens to a realistic embedding table
    (the seed's Chinese DeBERTa has 21,128). ``safe_serialization=False`` saves ``pytorch_model.bin``
    (a pickle, as checkpoints saved before safetensors were the default), sharded by ``max_shard_size``.
    """
    import torch
    from transformers import AutoModelForSequenceClassification, BertTokenizerFast

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    vocab = pad_vocab(build_vocab(corpus), vocab_size)
    config = _config(
        architecture,
        vocab_size=len(vocab),
        labels=labels,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        max_position=max_position,
    )
    model = AutoModelForSequenceClassification.from_config(config)
    head = model.classifier if hasattr(model, "classifier") else None
    if logit_scale != 1.0 and head is not None:
        with torch.no_grad():
            head.weight.mul_(logit_scale)
    model.eval()
    vocab_file = out_dir / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab_file), do_lower_case=True, tokenize_chinese_chars=True)
    tokenizer.model_max_length = max_position
    tokenizer.save_pretrained(str(out_dir))
    shards = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(out_dir), safe_serialization=safe_serialization, **shards)
    (out_dir / "label.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    if golden is not None:
        (out_dir / "golden.txt").write_text("\n".join(golden) + "\n", encoding="utf-8")
    if complete:
        from seqcls.release.completion import mark_complete

        mark_complete(out_dir, run=f"seqcls_tools.testing_hf.build_tiny_hf_checkpoint({architecture}, seed={seed})")
    log.info("built tiny HF %s checkpoint in %s (%d labels, vocab %d)", architecture, out_dir, len(labels), len(vocab))
    return out_dir
