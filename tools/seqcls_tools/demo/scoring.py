"""Scoring the demo model: F1, the golden texts for the smoke test, example predictions for the log."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

log = logging.getLogger("seqcls_tools.demo.train")

THRESHOLD = 0.5
#: Golden texts keep every probability at least this far from THRESHOLD.
GOLDEN_MARGIN = 0.1
GOLDEN_MAX = 32
GOLDEN_MIN = 24


def f1_scores(gold: np.ndarray, pred: np.ndarray) -> tuple[float, float]:
    """(micro, macro) F1 of 0/1 matrices ``[n_texts, n_labels]``; a label never gold nor
    predicted counts as F1 1.0 in the macro average (nothing to get wrong)."""
    tp = (gold * pred).sum(axis=0).astype(float)
    fp = ((1 - gold) * pred).sum(axis=0).astype(float)
    fn = (gold * (1 - pred)).sum(axis=0).astype(float)
    denom = 2 * tp.sum() + fp.sum() + fn.sum()
    micro = float(2 * tp.sum() / denom) if denom else 1.0
    per_label = np.where(2 * tp + fp + fn > 0, 2 * tp / np.maximum(2 * tp + fp + fn, 1), 1.0)
    return micro, float(per_label.mean())


def multi_hot(rows: Sequence[dict], labels: Sequence[str]) -> np.ndarray:
    index = {label: i for i, label in enumerate(labels)}
    out = np.zeros((len(rows), len(labels)), dtype="float32")
    for r, row in enumerate(rows):
        for label in row["labels"]:
            out[r, index[label]] = 1.0
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def select_golden(
    texts: Sequence[str],
    gold: np.ndarray,
    probs: np.ndarray,
    labels: Sequence[str],
    *,
    limit: int = GOLDEN_MAX,
    margin: float = GOLDEN_MARGIN,
) -> list[int]:
    """Indices of held-out texts for the smoke test: correct and confident, spread over labels.

    Candidates are exact-match predictions with no probability within ``margin`` of 0.5. They
    are queued by their leaf label (two-branch texts get a queue of their own) and taken
    round-robin, most confident first, so every label gets checked. If too few qualify (an
    under-trained quick run) the most confident remaining texts top the list up to
    ``GOLDEN_MIN``: the pipeline needs stable decisions more than correct ones.
    """
    pred = (probs >= THRESHOLD).astype("float32")
    confidence = np.abs(probs - THRESHOLD).min(axis=1)
    exact = (pred == gold).all(axis=1)
    candidates = [i for i in range(len(texts)) if exact[i] and confidence[i] >= margin]
    candidates.sort(key=lambda i: (-confidence[i], i))
    by_key: dict[int, list[int]] = {}
    for i in candidates:
        leaves = [int(j) for j in np.flatnonzero(gold[i]) if "##" in labels[j]]
        key = leaves[0] if len(leaves) == 1 else -1  # -1: several events (or none)
        by_key.setdefault(key, []).append(i)
    chosen: list[int] = []
    queues = [by_key[k] for k in sorted(by_key)]
    while len(chosen) < limit and any(queues):
        for queue in queues:
            if queue and len(chosen) < limit:
                chosen.append(queue.pop(0))
    if len(chosen) < GOLDEN_MIN:
        log.warning("only %d confident correct held-out texts; topping up golden.txt", len(chosen))
        rest = sorted((i for i in range(len(texts)) if i not in chosen), key=lambda i: (-confidence[i], i))
        chosen += rest[: max(0, GOLDEN_MIN - len(chosen))]
    return chosen


def example_predictions(rows: Sequence[dict], probs: np.ndarray, labels: Sequence[str], n: int = 5) -> list[dict]:
    """A few test predictions for the README/log: one two-branch text, one English, then others."""
    picks: list[int] = []
    two_branch = [i for i, r in enumerate(rows) if len({lb.split("##")[0] for lb in r["labels"]}) > 1]
    english = [i for i, r in enumerate(rows) if r["text"].isascii()]
    for i in [*two_branch[:1], *english[:1], *range(len(rows))]:
        if i not in picks:
            picks.append(i)
        if len(picks) == n:
            break
    return [
        {
            "text": rows[i]["text"],
            "gold": rows[i]["labels"],
            "predicted": {
                labels[j]: round(float(probs[i, j]), 4) for j in np.argsort(-probs[i]) if probs[i, j] >= THRESHOLD
            },
        }
        for i in picks
    ]
