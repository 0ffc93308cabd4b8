"""Postprocess logic (logits → label names), shared by Triton's ``seqcls_postprocess`` model
and seqcls's validate/smoke steps.

Copied into every published ``seqcls_postprocess`` version and imported by its ``model.py``;
validate imports this very file to compute the expected decisions the smoke test asserts.
Dependencies: numpy only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np

SEPARATOR = "##"


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Numerically stable sigmoid in float64, returned as float32."""
    x = np.asarray(logits, dtype=np.float64)
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    ex = np.exp(x[~pos])
    out[~pos] = ex / (1.0 + ex)
    return out.astype(np.float32)


def threshold_vector(
    labels: Sequence[str], default: float = 0.5, per_label: Mapping[str, float] | None = None
) -> np.ndarray:
    """One threshold per label: ``default`` unless ``per_label`` names the label."""
    per_label = dict(per_label or {})
    unknown = sorted(set(per_label) - set(labels))
    if unknown:
        raise ValueError(f"thresholds name unknown labels: {', '.join(unknown)}")
    return np.array([float(per_label.get(lbl, default)) for lbl in labels], dtype=np.float32)


def parse_thresholds(text: str, labels: Sequence[str]) -> np.ndarray:
    """Thresholds from a config parameter: a number, or JSON ``{"default": x, "label": y}``."""
    text = (text or "").strip() or "0.5"
    try:
        return threshold_vector(labels, float(text))
    except ValueError:
        pass
    spec = json.loads(text)
    default = float(spec.pop("default", 0.5))
    return threshold_vector(labels, default, spec)


def parent_indices(labels: Sequence[str]) -> list[int | None]:
    """For each label, the index of its ``##`` parent if the parent is itself a label."""
    index = {lbl: i for i, lbl in enumerate(labels)}
    out: list[int | None] = []
    for lbl in labels:
        parent = lbl.rsplit(SEPARATOR, 1)[0] if SEPARATOR in lbl else None
        out.append(index.get(parent) if parent is not None else None)
    return out


def decide(
    probs: np.ndarray, thresholds: np.ndarray, labels: Sequence[str], *, hierarchy: bool = True
) -> list[list[tuple[str, float]]]:
    """Per row: the predicted ``(label, confidence)`` pairs, sorted by label index.

    With ``hierarchy``, a predicted child implies its ``##`` parent: the parent is added with
    confidence ``max(p_parent, p_child)`` (repeated up the tree).
    """
    probs = np.asarray(probs, dtype=np.float32)
    if probs.ndim != 2 or probs.shape[1] != len(labels):
        raise ValueError(f"expected probabilities of shape [N, {len(labels)}], got {list(probs.shape)}")
    parents = parent_indices(labels) if hierarchy else [None] * len(labels)
    rows: list[list[tuple[str, float]]] = []
    for p in probs:
        conf = {int(i): float(p[i]) for i in np.nonzero(p >= thresholds)[0]}
        if hierarchy:
            for i in sorted(conf, reverse=True):
                child, parent = i, parents[i]
                while parent is not None:
                    conf[parent] = max(conf.get(parent, float(p[parent])), conf[child])
                    child, parent = parent, parents[parent]
        rows.append([(labels[i], conf[i]) for i in sorted(conf)])
    return rows


def near_threshold(probs: np.ndarray, thresholds: np.ndarray, margin: float) -> np.ndarray:
    """Boolean ``[N]``: a row has a probability within ``margin`` of its threshold."""
    return (np.abs(np.asarray(probs) - thresholds) <= margin).any(axis=1)


def tally(
    rows: Sequence[Sequence[tuple[str, float]]],
    probs: np.ndarray,
    thresholds: np.ndarray,
    margin: float,
    bounds: Sequence[float] = (),
) -> dict:
    """What the serving metrics count for a batch of decided rows (also the release's reference).

    ``texts``; ``labels``: texts per predicted label (after the hierarchy rule), only labels that
    occur; ``unlabeled``: texts with no label; ``near``: per label index, texts whose probability
    is within ``margin`` of the threshold; ``top``: each text's highest probability; ``buckets``:
    how many tops are at most each of ``bounds`` (a Prometheus histogram's ``le`` buckets).
    """
    probs = np.asarray(probs, dtype=np.float32)
    counts: dict[str, int] = {}
    for row in rows:
        for label, _ in row:
            counts[label] = counts.get(label, 0) + 1
    n = len(rows)
    if n and probs.ndim == 2 and probs.shape[1]:
        near = (np.abs(probs - np.asarray(thresholds, dtype=np.float32)) <= margin).sum(axis=0)
        top = probs.max(axis=1)
    else:
        near = np.zeros(probs.shape[1] if probs.ndim == 2 else 0, dtype=np.int64)
        top = np.zeros(n, dtype=np.float32)
    return {
        "texts": n,
        "labels": counts,
        "unlabeled": sum(1 for row in rows if not row),
        "near": near.astype(np.int64),
        "top": top,
        "buckets": cumulative(top, bounds),
    }


def cumulative(values: np.ndarray, bounds: Sequence[float]) -> list[int]:
    """How many of ``values`` are at most each bound (a Prometheus histogram's ``le`` buckets)."""
    values = np.sort(np.asarray(values, dtype=np.float64).reshape(-1))
    return [int(n) for n in np.searchsorted(values, np.asarray(bounds, dtype=np.float64), side="right")]
