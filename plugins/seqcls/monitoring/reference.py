"""A release's reference distribution: what its served graph predicts on known texts.

Why: live label shares mean nothing without a baseline from the same model and decision rule.
The evaluate step computes it on the eval set (or validate's golden texts when there is none)
with the very decisions Triton makes; publish stores it in every version's ``release.json``
(``reference``) and register logs it to MLflow, so ``seqcls monitor`` compares live traffic with
the version that is actually served, not with the latest training job.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.contract import shipped


@dataclass(frozen=True)
class Reference:
    """Counts over ``texts`` texts, as the serving models count them (see ``seqcls_contract``)."""

    source: str  # "eval_set" | "golden"
    texts: int
    labels: dict[str, int]  # texts predicted with each label (every label, zeros included)
    unlabeled: int  # texts with no label
    near_threshold: dict[str, int]  # texts with the label's probability within the margin of its threshold
    confidence_buckets: list[float]  # upper bounds (le) of the top-confidence histogram, +Inf implied
    confidence_counts: list[int]  # cumulative counts per bound, then the +Inf count (== texts)
    truncated: int = 0  # texts longer than max_length tokens
    sha256: str | None = None  # of the texts' file, when there is one
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reference:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def compute(
    probabilities: np.ndarray,
    thresholds: Sequence[float],
    labels: Sequence[str],
    *,
    hierarchy: bool,
    source: str,
    truncated: int = 0,
    sha256: str | None = None,
    path: str | None = None,
) -> Reference:
    """The reference of ``probabilities`` ([N, C], sigmoid outputs), decided and counted by the same
    functions as the served postprocess model (``seqcls_decide.decide`` and ``tally``)."""
    contract, decide = shipped.contract(), shipped.decide()
    probs = np.asarray(probabilities, dtype=np.float32).reshape(-1, len(labels))
    thr = np.asarray(thresholds, dtype=np.float32)
    rows = decide.decide(probs, thr, list(labels), hierarchy=hierarchy)
    buckets = [float(b) for b in contract.CONFIDENCE_BUCKETS]
    counted = decide.tally(rows, probs, thr, contract.NEAR_THRESHOLD_MARGIN, buckets)
    return Reference(
        source=source,
        texts=counted["texts"],
        labels={label: int(counted["labels"].get(label, 0)) for label in labels},
        unlabeled=int(counted["unlabeled"]),
        near_threshold={label: int(n) for label, n in zip(labels, counted["near"], strict=True)},
        confidence_buckets=buckets,
        confidence_counts=[*counted["buckets"], counted["texts"]],
        truncated=int(truncated),
        sha256=sha256,
        path=path,
    )


def save(reference: Reference, path: Path) -> Path:
    path.write_text(json.dumps(reference.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
    return path


def load(path: Path) -> Reference | None:
    """The reference recorded at ``path``; None when there is none (a workspace from before references)."""
    if not path.is_file():
        return None
    return Reference.from_dict(json.loads(path.read_text(encoding="utf-8")))


def metric_labels(labels: Sequence[str], reference: Reference | None, limit: int | None = None) -> list[str]:
    """The labels that get their own series (all of them up to the limit; else the most frequent
    in the reference, ties in label order), so a model with thousands of labels stays bounded."""
    limit = shipped.contract().MAX_LABEL_SERIES if limit is None else limit
    if len(labels) <= limit:
        return list(labels)
    order = {label: i for i, label in enumerate(labels)}
    counts = reference.labels if reference else {}
    ranked = sorted(labels, key=lambda lbl: (-counts.get(lbl, 0), order[lbl]))
    return sorted(ranked[: limit - 1], key=order.__getitem__)  # one series left for the rest (OTHER_LABEL)
