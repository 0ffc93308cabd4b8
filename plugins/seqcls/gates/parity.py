"""The parity gate's numbers: tokenizer ids, logits, probabilities, decisions — no orchestration.

:mod:`seqcls.steps.validate` decides *what* to compare and records the outcome; the reference
numbers come from the framework adapters (:mod:`seqcls.frameworks`), the served graph's from
:mod:`seqcls.contract.runtime`. This module only computes, so each check can be tested (and rerun by
a person) on its own.

Tolerances are derived from one another. The gate is on logits: ``|Δ| <= atol + rtol·|x|``.
Sigmoid's slope is at most 1/4, so logits inside that bound move a probability by at most
``(atol + rtol·|x|) / 4`` — that is the probability tolerance unless ``prob_atol`` is set, in
which case it is an *additional*, stricter requirement the user asked for. (The old fixed
``prob_atol=1e-5`` rejected models the logit tolerance accepted: logits within 4.2e-5 moved a
probability by 1.05e-5.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SIGMOID_MAX_SLOPE = 0.25
FLOAT32_EPS = float(np.finfo(np.float32).eps)  # the rounding of a float32 probability near 0.5


@dataclass(frozen=True)
class Tolerance:
    """Logit tolerance ``atol + rtol·|x|``; probabilities follow it unless ``prob_atol`` tightens them."""

    atol: float
    rtol: float
    prob_atol: float | None = None

    def scaled(self, factor: float) -> Tolerance:
        prob = None if self.prob_atol is None else self.prob_atol * factor
        return Tolerance(self.atol * factor, self.rtol * factor, prob)

    def logit_bound(self, ref: np.ndarray) -> np.ndarray:
        return self.atol + self.rtol * np.abs(ref)

    def prob_bound(self, ref: np.ndarray) -> np.ndarray:
        """Per element: what the logit bound permits through sigmoid, capped by ``prob_atol`` if set."""
        derived = SIGMOID_MAX_SLOPE * self.logit_bound(ref) + FLOAT32_EPS  # sigmoid is computed in float32
        return derived if self.prob_atol is None else np.minimum(derived, self.prob_atol)

    @property
    def prob_atol_effective(self) -> float:
        """The scalar probability tolerance for consumers without logits (the smoke test)."""
        derived = SIGMOID_MAX_SLOPE * self.atol
        return derived if self.prob_atol is None else min(derived, self.prob_atol)


def compare_ids(texts: Sequence[str], ref: Sequence[Sequence[int]], got: Sequence[Sequence[int]]) -> dict[str, Any]:
    diffs = [i for i, (a, b) in enumerate(zip(ref, got, strict=True)) if list(a) != list(b)]
    out: dict[str, Any] = {"texts": len(texts), "mismatched": len(diffs), "passed": not diffs}
    if diffs:
        i = diffs[0]
        out["first_mismatch"] = {
            "index": i,
            "text": texts[i][:200],
            "reference": list(ref[i])[:64],
            "serving": list(got[i])[:64],
        }
    return out


def numeric_report(ref: np.ndarray, got: np.ndarray, tol: Tolerance, decide_mod) -> dict[str, Any]:
    report: dict[str, Any] = {"shape": list(ref.shape)}
    finite = bool(np.isfinite(ref).all() and np.isfinite(got).all())
    report["finite"] = finite
    if not finite:
        report["passed"] = False
        report["nan_or_inf"] = {"paddle": int((~np.isfinite(ref)).sum()), "onnxruntime": int((~np.isfinite(got)).sum())}
        return report
    diff = np.abs(ref - got)
    rel = diff / np.maximum(np.abs(ref), 1e-12)
    p_ref, p_got = decide_mod.sigmoid(ref), decide_mod.sigmoid(got)
    pdiff = np.abs(p_ref - p_got)
    bad = diff > tol.logit_bound(ref)
    report.update(
        {
            "logits_max_abs_diff": float(diff.max(initial=0.0)),
            "logits_mean_abs_diff": float(diff.mean()) if diff.size else 0.0,
            "logits_max_rel_diff": float(rel.max(initial=0.0)),
            "prob_max_abs_diff": float(pdiff.max(initial=0.0)),
            "logits_out_of_tolerance": int(bad.sum()),
            "prob_out_of_tolerance": int((pdiff > tol.prob_bound(ref)).sum()),
            "atol": tol.atol,
            "rtol": tol.rtol,
            "prob_atol": tol.prob_atol,
            "prob_tolerance": "derived: (atol + rtol·|x|)/4" if tol.prob_atol is None else "min(derived, prob_atol)",
        }
    )
    report["passed"] = report["logits_out_of_tolerance"] == 0 and report["prob_out_of_tolerance"] == 0
    return report


def decision_report(
    texts: Sequence[str],
    p_ref: np.ndarray,
    p_got: np.ndarray,
    thresholds: np.ndarray,
    labels: Sequence[str],
    margin: float,
    hierarchy: bool,
    decide_mod,
) -> dict[str, Any]:
    ref = decide_mod.decide(p_ref, thresholds, labels, hierarchy=hierarchy)
    got = decide_mod.decide(p_got, thresholds, labels, hierarchy=hierarchy)
    near = decide_mod.near_threshold(p_ref, thresholds, margin) | decide_mod.near_threshold(p_got, thresholds, margin)
    changed = []
    label_decisions = len(texts) * len(labels)
    changed_labels = 0
    for i, (a, b) in enumerate(zip(ref, got, strict=True)):
        sa, sb = {x[0] for x in a}, {x[0] for x in b}
        if sa != sb:
            changed_labels += len(sa ^ sb)
            changed.append(
                {
                    "index": i,
                    "text": texts[i][:120],
                    "paddle": sorted(sa),
                    "onnxruntime": sorted(sb),
                    "near_threshold": bool(near[i]),
                }
            )
    hard = [c for c in changed if not c["near_threshold"]]
    return {
        "texts": len(texts),
        "changed": len(changed),
        "changed_not_near_threshold": len(hard),
        "near_threshold": int(near.sum()),
        "near_threshold_indices": [int(i) for i in np.nonzero(near)[0]],
        "label_decisions": label_decisions,
        "label_decisions_changed": changed_labels,
        "agreement": 1.0 - changed_labels / max(label_decisions, 1),
        "changes": changed,
        "passed": not hard,
    }


def batch_invariance(
    texts: Sequence[str],
    alone: np.ndarray,
    together: Callable[[list[int]], np.ndarray],
    *,
    compositions: int = 24,
    max_batch: int = 8,
    seed: int = 0,
) -> dict[str, Any]:
    """Whether each text's logits are bit-identical alone (``alone``, one row per text) and run with others:
    ``together(indices)`` answers the texts at ``indices`` in one shared run, in that order. Random
    compositions (2..``max_batch`` texts, any order, so any neighbours and positions); ``passed`` only when
    no row moved by a single bit — a tolerance would let a text's answer depend on who else was asking."""
    rng = np.random.default_rng(seed)
    n = len(texts)
    out: dict[str, Any] = {"texts": n, "compositions": 0, "rows_compared": 0, "rows_differing": 0}
    worst, first = 0.0, None
    for _ in range(compositions if n > 1 else 0):
        members = [int(i) for i in rng.permutation(n)[: int(rng.integers(2, min(max_batch, n) + 1))]]
        got = np.asarray(together(members))
        out["compositions"] += 1
        for pos, i in enumerate(members):
            out["rows_compared"] += 1
            if not np.array_equal(got[pos], alone[i]):
                diff = float(np.abs(got[pos] - alone[i]).max())
                worst = max(worst, diff)
                out["rows_differing"] += 1
                if first is None:
                    first = {
                        "index": i,
                        "text": texts[i][:120],
                        "position": pos,
                        "batch": len(members),
                        "max_abs_diff": diff,
                    }
    out["max_abs_diff"] = worst
    out["first_difference"] = first
    out["passed"] = out["rows_compared"] > 0 and out["rows_differing"] == 0
    return out
