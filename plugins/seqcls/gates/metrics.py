"""How good one model's decisions are on a labeled set: multi-label, per-label, per-level and hierarchical F.

Inputs are label *sets* per text (the served decisions, thresholds applied), so every model — the
candidate, the champion, a reduced-precision profile — is scored by the same code on the same
texts. Conventions (zero division is 0, as scikit-learn's ``zero_division=0``):

- micro P/R/F pool the true/false positives and misses of all labels; a predicted label outside
  the label space (a champion may know labels the candidate dropped) is a false positive;
- macro-F1 averages per-label F1 over the labels that occur in the gold sets *or* the
  predictions. A label in neither says nothing about the model on this set; counting it as 0
  (scikit-learn's ``average="macro"`` over all labels, which PaddleNLP's training log prints) would
  make macro-F1 depend on how many labels the eval set happens to lack;
- hierarchical P/R/F (Kiritchenko et al.) add every ancestor of a label (``a`` and ``a##b`` for
  ``a##b##c``) to both sets before pooling, so predicting a sibling of the right leaf earns the
  shared parent instead of nothing;
- a level is a label's depth, its number of ``##``-separated parts; per level, only its labels count.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.files import atomic_write

log = logging.getLogger(__name__)

SEP = "##"
BAD_CASE_COLUMNS = ("text", "gold", "predicted", "missing", "extra", "confidences")


def depth(label: str) -> int:
    """The level of ``label``: 1 for ``a``, 2 for ``a##b``."""
    return label.count(SEP) + 1


def ancestors(label: str) -> tuple[str, ...]:
    """``("a", "a##b")`` for ``a##b##c``, root first; ``()`` for a top-level label."""
    parts = label.split(SEP)
    return tuple(SEP.join(parts[:i]) for i in range(1, len(parts)))


@dataclass
class Scores:
    """One model's scores on one eval set (see the module docstring for the conventions)."""

    texts: int
    micro_precision: float
    micro_recall: float
    micro_f1: float
    macro_f1: float
    sample_accuracy: float
    hierarchical_precision: float
    hierarchical_recall: float
    hierarchical_f1: float
    hierarchy_consistency: float
    per_label: dict[str, dict[str, float]]
    per_level: dict[str, dict[str, float]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def headline(self) -> dict[str, float]:
        """The flat numbers a tracking server plots (MLflow metrics are floats under flat keys)."""
        out = {
            name: float(getattr(self, name))
            for name in (
                "micro_f1",
                "macro_f1",
                "micro_precision",
                "micro_recall",
                "sample_accuracy",
                "hierarchical_f1",
                "hierarchy_consistency",
            )
        }
        for level, values in self.per_level.items():
            out[f"level_{level}_micro_f1"] = float(values["micro_f1"])
            out[f"level_{level}_macro_f1"] = float(values["macro_f1"])
        return out


def prf(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    """Precision, recall and F1 from counts; 0.0 where a denominator is 0 (``zero_division=0``)."""
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    return precision, recall, f1


def _universe(labels: Sequence[str], gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> list[str]:
    """The label space, then any other label met in gold or predictions (sorted): their misses count."""
    known = dict.fromkeys(labels)
    extra = sorted({lbl for row in (*gold, *pred) for lbl in row if lbl not in known})
    return [*known, *extra]


def _multi_hot(rows: Sequence[Sequence[str]], index: Mapping[str, int]) -> np.ndarray:
    out = np.zeros((len(rows), len(index)), dtype=bool)
    for i, row in enumerate(rows):
        out[i, [index[lbl] for lbl in row]] = True
    return out


def _per_label(universe: list[str], tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> dict[str, dict[str, float]]:
    out = {}
    for j, label in enumerate(universe):
        t, f_pos, f_neg = int(tp[j]), int(fp[j]), int(fn[j])
        precision, recall, f1 = prf(t, f_pos, f_neg)
        out[label] = {
            "precision": precision,
            "recall": recall,
            "f1": f1,
            "support": t + f_neg,
            "predicted": t + f_pos,
            "tp": t,
            "fp": f_pos,
            "fn": f_neg,
        }
    return out


def _macro(per_label: Mapping[str, Mapping[str, float]], names: Iterable[str]) -> float:
    """Mean F1 of the labels among ``names`` that occur in gold or predictions (0.0 when none does)."""
    f1s = [per_label[n]["f1"] for n in names if per_label[n]["support"] or per_label[n]["predicted"]]
    return float(np.mean(f1s)) if f1s else 0.0


def _per_level(per_label: Mapping[str, Mapping[str, float]], space: set[str]) -> dict[str, dict[str, float]]:
    out = {}
    for level in sorted({depth(lbl) for lbl in per_label}):
        names = [lbl for lbl in per_label if depth(lbl) == level]
        tp, fp, fn = (sum(int(per_label[n][k]) for n in names) for k in ("tp", "fp", "fn"))
        out[str(level)] = {
            "micro_f1": prf(tp, fp, fn)[2],
            "macro_f1": _macro(per_label, names),
            "labels": sum(1 for n in names if n in space),
            "support": tp + fn,
        }
    return out


def _hierarchical(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> tuple[float, float, float]:
    """Kiritchenko's hP, hR, hF: micro P/R/F over the sets augmented with every ancestor."""
    tp = fp = fn = 0
    for g, p in zip(gold, pred, strict=True):
        g_aug = {a for lbl in g for a in (*ancestors(lbl), lbl)}
        p_aug = {a for lbl in p for a in (*ancestors(lbl), lbl)}
        tp += len(g_aug & p_aug)
        fp += len(p_aug - g_aug)
        fn += len(g_aug - p_aug)
    return prf(tp, fp, fn)


def consistent(predicted: Iterable[str], space: set[str]) -> bool:
    """Whether every predicted ``a##b`` comes with its nearest ancestor that is itself a label.

    A multi-label head decides each label alone, so it can predict a child without its parent; a
    retrained model that does so more often serves answers a hierarchy-aware client cannot use.
    """
    chosen = set(predicted)
    for label in chosen:
        parent = next((a for a in reversed(ancestors(label)) if a in space), None)
        if parent is not None and parent not in chosen:
            return False
    return True


def score(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]], labels: Sequence[str]) -> Scores:
    """Score the predicted label sets ``pred`` against ``gold`` (one set per text) in the label space ``labels``."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold label sets but {len(pred)} predictions: score the same texts")
    if not gold:
        raise ValueError("no texts to score")
    universe = _universe(labels, gold, pred)
    index = {lbl: j for j, lbl in enumerate(universe)}
    g, p = _multi_hot(gold, index), _multi_hot(pred, index)
    tp, fp, fn = (g & p).sum(0), (~g & p).sum(0), (g & ~p).sum(0)
    per_label = _per_label(universe, tp, fp, fn)
    micro_p, micro_r, micro_f = prf(int(tp.sum()), int(fp.sum()), int(fn.sum()))
    h_p, h_r, h_f = _hierarchical(gold, pred)
    space = set(labels)
    return Scores(
        texts=len(gold),
        micro_precision=micro_p,
        micro_recall=micro_r,
        micro_f1=micro_f,
        macro_f1=_macro(per_label, universe),
        sample_accuracy=float((g == p).all(axis=1).mean()),
        hierarchical_precision=h_p,
        hierarchical_recall=h_r,
        hierarchical_f1=h_f,
        hierarchy_consistency=sum(consistent(row, space) for row in pred) / len(pred),
        per_label=per_label,
        per_level=_per_level(per_label, space),
    )


def bad_cases(
    texts: Sequence[str],
    gold: Sequence[Sequence[str]],
    pred: Sequence[Sequence[str]],
    confidences: Sequence[Mapping[str, float]],
) -> list[dict[str, Any]]:
    """The texts whose predicted set differs from the gold set, with what was missed, added, and how sure.

    ``confidences`` holds each text's probability per label; a row keeps those of its predicted and
    gold labels (a gold label the model does not know has none).
    """
    rows = []
    for text, g, p, conf in zip(texts, gold, pred, confidences, strict=True):
        g_set, p_set = set(g), set(p)
        if g_set == p_set:
            continue
        shown = dict.fromkeys([*p, *g])
        rows.append(
            {
                "text": text,
                "gold": list(dict.fromkeys(g)),
                "predicted": list(dict.fromkeys(p)),
                "confidences": {lbl: float(conf[lbl]) for lbl in shown if lbl in conf},
                "missing": [lbl for lbl in dict.fromkeys(g) if lbl not in p_set],
                "extra": [lbl for lbl in dict.fromkeys(p) if lbl not in g_set],
            }
        )
    return rows


def write_bad_cases(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write ``rows`` (from :func:`bad_cases`) as a TSV a person can open in a spreadsheet.

    Quoted as the ``csv`` module does (``excel-tab``), because texts may hold tabs, newlines and quotes.
    """
    path = Path(path)
    buffer = io.StringIO()
    writer = csv.writer(buffer, dialect="excel-tab", lineterminator="\n")
    writer.writerow(BAD_CASE_COLUMNS)
    count = 0
    for row in rows:
        confidences = {k: round(float(v), 6) for k, v in row["confidences"].items()}
        writer.writerow(
            [
                row["text"],
                ",".join(row["gold"]),
                ",".join(row["predicted"]),
                ",".join(row["missing"]),
                ",".join(row["extra"]),
                json.dumps(confidences, ensure_ascii=False),
            ]
        )
        count += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buffer.getvalue())
    log.info("bad cases: %d texts written to %s", count, path)
    return path
