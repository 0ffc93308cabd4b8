"""Is a drop real at this eval set's size? A paired bootstrap of every metric the change rules compare.

Why: a fixed threshold ignores how much evidence is behind a number. On 40 texts one text moves
micro-F1 by about 0.01 and sample accuracy by 0.025, so a threshold of 0.025 refuses an equally good
retrain that happened to get one more text wrong — and on 4,000 texts the same threshold is all the
rule knows. Candidate and champion answer the *same* texts, so their scores are paired: most texts
are answered alike, and only the texts they answer differently say anything about which model is
better. Resampling whole texts (with replacement) and recomputing both models' metrics on each
resample gives the distribution of the drop as the eval set's own texts make it vary; paired,
because each resample weighs one text the same for both models, so what both get right or wrong
cancels, as it does in the observed drop.

How: each text's outcome is, per label and per model, one of true positive, false positive, miss or
true negative. Every metric the change rules compare (micro-/macro-F1, sample accuracy, each
hierarchy level's micro-/macro-F1, each label's F1) is a function of the per-label TP/FP/FN totals
(and the count of exactly-right texts), so one block of resample weights, summed over where each
outcome occurs, gives every metric of every resample at once. Texts with the same outcome pattern
(the demo model on 200,000 texts: a few hundred patterns) are merged first; the resample weights of
a group of ``k`` of the ``n`` texts are then drawn as one multinomial over the groups (probability
``k/n``), which is the same distribution as drawing ``n`` texts with replacement and counting. So
memory and time grow with the distinct patterns and the resamples (weights generated in blocks of
:data:`CHUNK_CELLS` cells), not with texts × resamples: the per-text arrays are only built once, as
``uint8`` codes. The measured cost at 200,000 texts is on the Performance page of the manual.

Intervals are percentile intervals of the drop (``champion - candidate``, positive = worse): the
``1 - confidence`` quantile is the one-sided lower bound (above a rule's threshold: the drop exceeds
the threshold beyond what resampling the texts explains, :mod:`seqcls.gates.rules` refuses), the
``confidence`` quantile the one-sided upper bound (above the threshold while the lower bound is not: the
eval set is too small to tell). Seeded: the same inputs always give the same intervals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from seqcls.gates.metrics import depth

#: The resamples and the one-sided confidence of each bound, unless told otherwise.
RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 20261204
#: Resample weights are generated (and summed) this many 8-byte cells at a time (about 16 MB each).
CHUNK_CELLS = 2_000_000
#: A label's outcome for one text: 2·gold + predicted.
TN, FP, FN, TP = 0, 1, 2, 3
OVERALL = ("micro_f1", "macro_f1", "sample_accuracy")


@dataclass(frozen=True)
class Interval:
    """The observed drop of one metric and its bootstrap bounds at ``confidence`` (each one-sided)."""

    metric: str
    candidate: float
    champion: float
    drop: float
    lower: float
    upper: float
    confidence: float
    relative: bool = False

    @property
    def significant(self) -> bool:
        """The candidate is worse beyond the noise of resampling the texts: the lower bound is above 0."""
        return self.lower > 0

    def exceeds(self, threshold: float) -> bool:
        """The drop is above ``threshold`` beyond that noise: the lower bound is above it."""
        return self.lower > threshold


@dataclass
class PairedCounts:
    """Both models' outcomes on the same texts, merged by pattern.

    ``cand``/``champ`` hold, per distinct pattern (row) and label (column), the outcome code
    (:data:`TN`, :data:`FP`, :data:`FN`, :data:`TP`); ``weight`` how many texts have that pattern.
    """

    labels: list[str]
    cand: np.ndarray  # [patterns, labels] uint8
    champ: np.ndarray  # [patterns, labels] uint8
    weight: np.ndarray  # [patterns] int64
    texts: int

    @property
    def patterns(self) -> int:
        return len(self.weight)


def _universe(labels: Sequence[str], *rows: Iterable[Sequence[str]]) -> list[str]:
    known = dict.fromkeys(labels)
    extra = sorted({lbl for group in rows for row in group for lbl in row if lbl not in known})
    return [*known, *extra]


def _codes(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]], index: Mapping[str, int]) -> np.ndarray:
    """Each text's outcome per label (2·gold + predicted) as ``uint8`` [texts, labels]."""
    out = np.zeros((len(gold), len(index)), dtype=np.uint8)
    for rows, bit in ((gold, 2), (pred, 1)):
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        cols = np.fromiter((index[lbl] for r in rows for lbl in r), dtype=np.int64, count=int(lengths.sum()))
        out[np.repeat(np.arange(len(rows)), lengths), cols] |= bit  # a label listed twice is still one
    return out


def paired_counts(
    gold: Sequence[Sequence[str]],
    candidate: Sequence[Sequence[str]],
    champion: Sequence[Sequence[str]],
    labels: Sequence[str],
) -> PairedCounts:
    """Each text's outcome per label for both models (label sets per text, thresholds applied), merged by
    pattern. ``labels`` is the label space; a label met only in gold or predictions is added (it counts)."""
    if not len(gold) == len(candidate) == len(champion):
        raise ValueError(
            f"{len(gold)} gold label sets, {len(candidate)} candidate and {len(champion)} champion answers: "
            "a paired test needs both models' answers on the same texts"
        )
    if not gold:
        raise ValueError("no texts to compare")
    universe = _universe(labels, gold, candidate, champion)
    index = {lbl: j for j, lbl in enumerate(universe)}
    both = np.concatenate([_codes(gold, candidate, index), _codes(gold, champion, index)], axis=1)
    rows = np.ascontiguousarray(both).view(np.dtype((np.void, both.shape[1])))[:, 0]
    _, first, weight = np.unique(rows, return_index=True, return_counts=True)
    merged = both[first]
    width = len(universe)
    return PairedCounts(universe, merged[:, :width], merged[:, width:], weight.astype(np.int64), len(gold))


def _f1(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> np.ndarray:
    """F1 elementwise, 0 where there is no true positive (``zero_division=0``)."""
    denominator = 2 * tp + fp + fn
    return np.where(tp > 0, 2 * tp / np.where(denominator > 0, denominator, 1), 0.0)


def _macro(f1: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Mean F1 over the labels present (gold or predicted) in each row; 0 where none is."""
    n = present.sum(axis=-1)
    return np.where(n > 0, (f1 * present).sum(axis=-1) / np.where(n > 0, n, 1), 0.0)


@dataclass
class _Outcome:
    """Where one outcome (TP, FP or FN) of one model occurs: pattern rows ordered by label, and each label's
    span in them, so a block of weights sums into per-label totals without a dense [patterns, labels] matrix."""

    rows: np.ndarray  # [occurrences] int64, grouped by label
    starts: np.ndarray  # [labels]
    ends: np.ndarray  # [labels]

    @classmethod
    def of(cls, hit: np.ndarray) -> _Outcome:
        label_major = np.nonzero(hit.T)  # (label, row) pairs, ordered by label
        cuts = np.searchsorted(label_major[0], np.arange(hit.shape[1] + 1))
        return cls(label_major[1].astype(np.int64), cuts[:-1], cuts[1:])

    def totals(self, w: np.ndarray) -> np.ndarray:
        """Each label's weighted count per row of ``w`` [resamples, patterns]: [resamples, labels]."""
        run = np.zeros((w.shape[0], len(self.rows) + 1), dtype=w.dtype)
        np.cumsum(w[:, self.rows], axis=1, out=run[:, 1:])
        return (run[:, self.ends] - run[:, self.starts]).astype(float)


@dataclass
class _Model:
    """One model's outcomes per pattern: where it has TP, FP, FN, and which patterns are exactly right."""

    tp: _Outcome
    fp: _Outcome
    fn: _Outcome
    exact: np.ndarray  # [patterns] float

    @classmethod
    def of(cls, codes: np.ndarray) -> _Model:
        fp, fn = codes == FP, codes == FN
        exact = (~(fp | fn).any(1)).astype(float)
        return cls(_Outcome.of(codes == TP), _Outcome.of(fp), _Outcome.of(fn), exact)

    @property
    def occurrences(self) -> int:
        return max(len(self.tp.rows), len(self.fp.rows), len(self.fn.rows))


def metric_names(labels: Sequence[str], judged: Iterable[str] = ()) -> list[str]:
    """The metric keys :func:`bootstrap` computes, as the rules name them."""
    levels = sorted({depth(lbl) for lbl in labels})
    names = [*OVERALL, *(f"level_{lv}.{m}" for lv in levels for m in ("micro_f1", "macro_f1"))]
    return names + [f"label[{lbl}].f1" for lbl in judged]


def _metrics(m: _Model, w: np.ndarray, texts: int, levels: Mapping[int, np.ndarray], judged: np.ndarray) -> np.ndarray:
    """Every metric (columns, :func:`metric_names`' order) of each resample (rows of integer weights ``w``)."""
    tp, fp, fn = m.tp.totals(w), m.fp.totals(w), m.fn.totals(w)  # [resamples, labels]
    f1 = _f1(tp, fp, fn)
    present = (tp + fp + fn) > 0
    cols = [_f1(tp.sum(1), fp.sum(1), fn.sum(1)), _macro(f1, present), (w @ m.exact) / texts]
    for mask in levels.values():
        cols.append(_f1(tp[:, mask].sum(1), fp[:, mask].sum(1), fn[:, mask].sum(1)))
        cols.append(_macro(f1[:, mask], present[:, mask]))
    return np.column_stack([*cols, f1[:, judged]])


@dataclass
class PairedTest:
    """Both models' metrics on every resample (plus the observed ones), from which each drop's interval is read."""

    names: list[str]
    observed_candidate: np.ndarray  # [metrics]
    observed_champion: np.ndarray
    candidate: np.ndarray  # [resamples, metrics]
    champion: np.ndarray
    texts: int
    patterns: int
    resamples: int
    confidence: float
    seed: int
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._index = {n: i for i, n in enumerate(self.names)}

    def __contains__(self, metric: str) -> bool:
        return metric in self._index

    def interval(self, metric: str, *, relative: bool = False, confidence: float | None = None) -> Interval:
        """The drop of ``metric`` (``champion - candidate``; divided by the champion's value when ``relative``)
        and its one-sided bounds at ``confidence`` (default: the test's)."""
        conf = self.confidence if confidence is None else confidence
        j = self._index[metric]
        cand, champ = self.candidate[:, j], self.champion[:, j]
        obs_c, obs_h = float(self.observed_candidate[j]), float(self.observed_champion[j])
        if relative:
            with np.errstate(divide="ignore", invalid="ignore"):
                drops = np.where(champ > 0, (champ - cand) / np.where(champ > 0, champ, 1), 0.0)
            drop = (obs_h - obs_c) / obs_h if obs_h > 0 else math.nan
        else:
            drops, drop = champ - cand, obs_h - obs_c
        lower, upper = np.quantile(drops, [1 - conf, conf])
        return Interval(metric, obs_c, obs_h, drop, float(lower), float(upper), conf, relative)

    def summary(self) -> dict[str, float | int]:
        return {
            "method": "paired bootstrap",
            "resamples": self.resamples,
            "confidence": self.confidence,
            "seed": self.seed,
            "texts": self.texts,
            "patterns": self.patterns,
        }


def bootstrap(
    counts: PairedCounts,
    *,
    judged: Iterable[str] = (),
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
    chunk: int | None = None,
) -> PairedTest:
    """Resample the texts ``resamples`` times (seeded) and compute both models' metrics on each.

    ``judged``: the labels whose own F1 is compared (the per-label rule's); ``chunk``: resamples per
    block of weights (default: as many as fit :data:`CHUNK_CELLS` cells), which changes memory, never
    the answer."""
    if resamples < 1:
        raise ValueError(f"resamples is {resamples}: expected at least 1")
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence is {confidence}: expected more than 0.5 and less than 1")
    judged = list(judged)
    index = {lbl: j for j, lbl in enumerate(counts.labels)}
    unknown = [lbl for lbl in judged if lbl not in index]
    if unknown:
        raise ValueError(f"labels {unknown} are not in the paired counts' label space")
    depths = np.array([depth(lbl) for lbl in counts.labels])
    levels = {lv: depths == lv for lv in sorted(set(depths.tolist()))}
    judged_idx = np.array([index[lbl] for lbl in judged], dtype=np.int64)
    cand, champ = _Model.of(counts.cand), _Model.of(counts.champ)
    p = counts.weight / counts.texts
    observed = counts.weight[np.newaxis, :]
    obs_c = _metrics(cand, observed, counts.texts, levels, judged_idx)[0]
    obs_h = _metrics(champ, observed, counts.texts, levels, judged_idx)[0]
    widest = max(counts.patterns, cand.occurrences, champ.occurrences, 1)
    step = chunk or max(1, CHUNK_CELLS // widest)
    rng = np.random.default_rng(seed)
    out_c, out_h = [], []
    for start in range(0, resamples, step):
        w = rng.multinomial(counts.texts, p, size=min(step, resamples - start))
        out_c.append(_metrics(cand, w, counts.texts, levels, judged_idx))
        out_h.append(_metrics(champ, w, counts.texts, levels, judged_idx))
    return PairedTest(
        metric_names(counts.labels, judged),
        obs_c,
        obs_h,
        np.concatenate(out_c),
        np.concatenate(out_h),
        counts.texts,
        counts.patterns,
        resamples,
        confidence,
        seed,
    )


__all__ = [
    "CONFIDENCE",
    "RESAMPLES",
    "Interval",
    "PairedCounts",
    "PairedTest",
    "bootstrap",
    "metric_names",
    "paired_counts",
]
