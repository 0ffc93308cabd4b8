"""The benchmark's model: an ERNIE classifier of a given shape with random weights.

No pretrained weights can be downloaded, and speed depends on the shape only, so the full
benchmark builds a randomly initialised model shaped like ERNIE 3.0 medium (6 layers, hidden
768, 12 heads, 40k vocabulary) with the 74-label head of the PaddleNLP sample. Two knobs make
its outputs look like a trained multi-label classifier's rather than a random one's:

- ``logit_scale`` multiplies the classifier weights so probabilities spread away from 0.5;
- the classifier bias is set (one value for every label) so that on average ``labels_per_text``
  labels pass the 0.5 threshold. With a zero bias a random head predicts about half of the 74
  labels for every text, and the labels whose mean logit happens to sit near zero decide every
  comparison — including INT8's decision-agreement gate — which no trained hierarchical
  classifier (1 parent + 1-2 children per text) looks like. The value is recorded in the results.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    vocab_size: int | None  # None: the corpus vocabulary only
    num_labels: int
    max_position: int
    logit_scale: float
    labels_per_text: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


MEDIUM = ModelSpec(
    name="ernie-3.0-medium-shape",
    hidden_size=768,
    num_layers=6,
    num_heads=12,
    vocab_size=40000,
    num_labels=74,
    max_position=2048,
    logit_scale=20.0,
    labels_per_text=2.5,
)
#: ERNIE 3.0 base's shape (12 layers): the base-size release timing (``seqcls_tools.bench.release_time``).
BASE = replace(MEDIUM, name="ernie-3.0-base-shape", num_layers=12)
TINY = ModelSpec(
    name="tiny",
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    vocab_size=None,
    num_labels=74,
    max_position=160,
    logit_scale=100.0,
    labels_per_text=2.5,
)


def build_checkpoint(
    out_dir: Path,
    spec: ModelSpec,
    corpus: Sequence[str],
    labels: Sequence[str],
    *,
    golden: Sequence[str],
    seed: int = 0,
    calibration_texts: int = 64,
) -> dict[str, Any]:
    """Build the checkpoint in ``out_dir``; returns facts about it (bias, labels per text)."""
    import paddle
    from paddlenlp.transformers import ErnieForSequenceClassification, ErnieTokenizer

    from seqcls_tools.testing import build_tiny_checkpoint

    build_tiny_checkpoint(
        out_dir,
        labels=labels,
        seed=seed,
        hidden_size=spec.hidden_size,
        num_layers=spec.num_layers,
        num_heads=spec.num_heads,
        max_position=spec.max_position,
        corpus=corpus,
        golden=golden,
        logit_scale=spec.logit_scale,
        vocab_size=spec.vocab_size,
    )
    model = ErnieForSequenceClassification.from_pretrained(str(out_dir))
    model.eval()
    tokenizer = ErnieTokenizer(str(out_dir / "vocab.txt"))
    sample = list(corpus[:calibration_texts])
    logits = []
    with paddle.no_grad():
        for start in range(0, len(sample), 16):
            enc = tokenizer(sample[start : start + 16], max_length=128, truncation=True, padding=True)
            out = model(
                paddle.to_tensor(enc["input_ids"], dtype="int64"),
                token_type_ids=paddle.to_tensor(enc["token_type_ids"], dtype="int64"),
            )
            logits.append(np.asarray(out.numpy(), dtype=np.float64))
    values = np.concatenate(logits)
    quantile = 1.0 - min(max(spec.labels_per_text / spec.num_labels, 0.0), 1.0)
    bias = -float(np.quantile(values, quantile))
    with paddle.no_grad():
        b = model.classifier.bias
        b.set_value(paddle.full(b.shape, bias, dtype=b.dtype))
    model.save_pretrained(str(out_dir))
    facts = {
        "spec": spec.to_dict(),
        "classifier_bias": round(bias, 4),
        "labels_per_text_before_bias": round(float((values > 0).sum(1).mean()), 2),
        "labels_per_text_after_bias": round(float(((values + bias) > 0).sum(1).mean()), 2),
        "calibration_texts": len(sample),
        "golden_texts": len(golden),
    }
    (out_dir / "bench_model.json").write_text(json.dumps(facts, indent=1), encoding="utf-8")
    log.info(
        "bench: %s checkpoint in %s — classifier bias %.2f (%.1f → %.1f labels per text)",
        spec.name,
        out_dir,
        bias,
        facts["labels_per_text_before_bias"],
        facts["labels_per_text_after_bias"],
    )
    return facts
