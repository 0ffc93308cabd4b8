"""Timing graphs in process the way they will be served: warm first, steady passes, and at the expected concurrency.

Why this is more than a loop of ``session.run``: an engine may pay a first-time cost per *input shape*
(OpenVINO compiles kernels for each new sequence length it meets, and its rate kept rising over the
first passes on the same texts), so a rate measured right after a warm-up on a handful of texts is the
cold rate, not the served one. So, for every graph:

1. **warm every length**: each distinct sequence length among the timed texts is run once, untimed;
2. **timed passes until steady**: the texts, each alone, over and over — the graphs taking turns by whole
   passes, in an order rotated every pass, so slow drifts of the host's load fall on all alike — until each
   graph's rate moved at most :data:`STEADY` between its last two passes, at least :data:`MIN_PASSES` and at
   most :data:`MAX_PASSES`; the last pass is the recorded one (still unsteady at the bound: the median pass
   after the first, :func:`recorded_pass`), every pass's rate is the curve. Why whole passes and not
   blocks of a few texts: graphs alternating every few texts were each timed slower than the same graph
   alone — most likely each evicting the others' weights from the caches, which a served model, the only
   one running, does not pay — and the fast profiles were recorded well below what they serve
   (docs/performance.md, "profile: auto"). Each turn starts with one untimed run, which brings the
   graph's weights back;
3. **at the expected concurrency**: ``clients`` single-text requests pending at once, as one served
   instance takes them from Triton's dynamic batcher: texts of equal length share one run where the
   served model merges them (the exact profiles), a batch's texts in one call to an engine that buckets
   them itself and shares runs only where no answer moves (bf16 after its load-time self-check), every
   text alone otherwise (int8's dynamic ranges, bf16 refused batching); in passes until steady as in
   step 2 (merged runs are shapes step 2 did not meet), the last pass's rate recorded.

The functions take sessions (anything with ``get_inputs`` and ``run``) and per-text feeds, so the
chooser (:mod:`seqcls.profiles.auto`) and the benchmark time the same way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from seqcls.config import DEFAULTS
from seqcls.spec import EXACT_PROFILES

#: Timed passes over the texts at least (two: "steady" needs a pass to compare with) and at most.
MIN_PASSES = 2
MAX_PASSES = 4
#: A graph is steady when its rate moved at most this much (relative) between its last two passes.
STEADY = 0.05
#: Single-text clients a model is expected to serve at once, unless its release says (``expected_clients``).
DEFAULT_CLIENTS = DEFAULTS.expected_clients

Feed = Mapping[str, np.ndarray]


@dataclass
class Timing:
    """One graph's timings: the recorded pass's per-text latencies (s) and outputs, every pass's rate (the
    curve), the rate at ``clients`` pending requests (None at one client), and what warming cost."""

    latencies: list[float] = field(default_factory=list)
    outputs: list[np.ndarray] = field(default_factory=list)
    passes: list[float] = field(default_factory=list)
    steady: bool = False
    clients: int = 1
    concurrent: float | None = None
    concurrent_passes: list[float] = field(default_factory=list)
    concurrent_steady: bool | None = None
    warm_lengths: int = 0
    warm_seconds: float = 0.0

    @property
    def single(self) -> float | None:
        """Sentences/s of the recorded pass, one text at a time."""
        total = float(sum(self.latencies))
        return len(self.latencies) / total if total > 0 else None

    def evidence(self) -> dict[str, Any]:
        return {
            "passes_sentences_per_s": [round(r, 2) for r in self.passes],
            "steady": self.steady,
            "clients": self.clients,
            "concurrent_sentences_per_s": None if self.concurrent is None else round(self.concurrent, 2),
            "concurrent_passes_sentences_per_s": [round(r, 2) for r in self.concurrent_passes],
            "concurrent_steady": self.concurrent_steady,
            "warm_lengths": self.warm_lengths,
            "warm_seconds": round(self.warm_seconds, 3),
        }


def length(feed: Feed) -> int:
    """A single-text feed's sequence length (its last axis)."""
    return int(next(iter(feed.values())).shape[-1])


def warm(session: Any, feeds: Sequence[Feed], output: str) -> tuple[int, float]:
    """Run one text of every distinct length once, untimed: (lengths warmed, seconds it took)."""
    t0 = time.perf_counter()
    firsts = {length(f): f for f in reversed(feeds)}  # the first feed of each length
    for f in firsts.values():
        session.run([output], dict(f))
    return len(firsts), time.perf_counter() - t0


def steady(rates: Sequence[float], tolerance: float = STEADY) -> bool:
    """Whether the last two passes' rates are within ``tolerance`` of each other."""
    if len(rates) < 2 or rates[-2] <= 0:
        return False
    return abs(rates[-1] - rates[-2]) / rates[-2] <= tolerance


def _rows(run: Feed) -> int:
    return int(next(iter(run.values())).shape[0])


def recorded_pass(curve: Sequence[float], ok: bool) -> int:
    """Which pass is recorded: the last when steady; otherwise (the host's load moved the rate to the end) the
    pass of median rate after the first (the first is the one still warming), not one noisy last sample."""
    if ok or len(curve) < 3:
        return len(curve) - 1
    later = sorted(range(1, len(curve)), key=lambda i: curve[i])
    return later[(len(later) - 1) // 2]


def passes_until_steady(
    sessions: Mapping[str, Any], runs: Mapping[str, Sequence[Feed]], output: str
) -> dict[str, tuple[list[float], list[np.ndarray], list[float], bool, int]]:
    """Timed passes over each graph's ``runs``, the graphs taking turns by whole passes (the order rotated
    every pass; each turn after one untimed run: module docstring), until every graph is :func:`steady`
    (bounded by :data:`MIN_PASSES`/:data:`MAX_PASSES`).
    Per graph: the :func:`recorded_pass`'s seconds per run, the last pass's outputs, every pass's
    sentences/s, steady or not, and which pass is recorded."""
    names = list(sessions)
    texts = {name: sum(_rows(r) for r in runs[name]) for name in names}
    curve: dict[str, list[float]] = {name: [] for name in names}
    every: dict[str, list[list[float]]] = {name: [] for name in names}
    outputs: dict[str, list[np.ndarray]] = {}
    for done in range(MAX_PASSES):
        lat: dict[str, list[float]] = {name: [] for name in names}
        out: dict[str, list[np.ndarray]] = {name: [] for name in names}
        turn = done % len(names) if names else 0
        for name in names[turn:] + names[:turn]:
            if runs[name]:
                sessions[name].run([output], dict(runs[name][0]))  # untimed: the weights back in the cache
            for run in runs[name]:
                t0 = time.perf_counter()
                result = sessions[name].run([output], dict(run))[0]
                lat[name].append(time.perf_counter() - t0)
                out[name].append(result)
        for name in names:
            seconds = float(sum(lat[name]))
            curve[name].append(texts[name] / seconds if seconds > 0 else 0.0)
            every[name].append(lat[name])
            outputs[name] = out[name]
        if done + 1 >= MIN_PASSES and all(steady(curve[name]) for name in names):
            break
    result = {}
    for name in names:
        ok = steady(curve[name])
        k = recorded_pass(curve[name], ok)
        result[name] = (every[name][k], outputs[name], curve[name], ok, k)
    return result


def runs_at(
    feeds: Sequence[Feed], clients: int, merge: bool, *, any_length: bool = False
) -> list[dict[str, np.ndarray]]:
    """The runs one served instance makes for ``feeds`` arriving ``clients`` at a time: per batch of
    ``clients`` texts, texts of one length stacked into one run when ``merge``, else each alone;
    ``any_length``: the whole batch in one call, padded with 0 to its longest (an engine that buckets rows
    itself, as ``seqcls_model`` hands them to bf16's)."""
    runs: list[dict[str, np.ndarray]] = []
    for start in range(0, len(feeds), clients):
        batch = feeds[start : start + clients]
        if any_length:
            width = max(length(f) for f in batch)
            runs.append({k: np.concatenate([_pad_to(f[k], width) for f in batch]) for k in batch[0]})
            continue
        if not merge:
            runs += [dict(f) for f in batch]
            continue
        by_length: dict[int, list[Feed]] = {}
        for f in batch:
            by_length.setdefault(length(f), []).append(f)
        for group in by_length.values():
            runs.append({k: np.concatenate([g[k] for g in group]) for k in group[0]})
    return runs


def _pad_to(x: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros((x.shape[0], width), dtype=x.dtype)
    out[:, : x.shape[1]] = x
    return out


def time_graphs(
    sessions: Mapping[str, Any], feeds: Mapping[str, Sequence[Feed]], output: str, clients: int = DEFAULT_CLIENTS
) -> dict[str, Timing]:
    """Every graph warmed, timed in steady single-text passes and (``clients`` > 1) in steady passes at
    ``clients`` pending requests; ``sessions`` and ``feeds`` are keyed by profile (it decides whether
    equal lengths merge)."""
    timings = {name: Timing(clients=clients) for name in sessions}
    for name, session in sessions.items():
        timings[name].warm_lengths, timings[name].warm_seconds = warm(session, feeds[name], output)
    for name, (lat, out, curve, ok, _) in passes_until_steady(sessions, feeds, output).items():
        t = timings[name]
        t.latencies, t.outputs, t.passes, t.steady = lat, out, curve, ok
    if clients > 1:
        runs = {
            name: runs_at(
                feeds[name],
                clients,
                merge=name in EXACT_PROFILES,
                any_length=bool(getattr(sessions[name], "batching", False)),  # bf16, batch-invariant here
            )
            for name in sessions
        }
        for name, (_, _, curve, ok, k) in passes_until_steady(sessions, runs, output).items():
            t = timings[name]
            t.concurrent, t.concurrent_passes, t.concurrent_steady = curve[k], curve, ok
    return timings


__all__ = [
    "DEFAULT_CLIENTS",
    "MAX_PASSES",
    "MIN_PASSES",
    "STEADY",
    "Timing",
    "passes_until_steady",
    "recorded_pass",
    "runs_at",
    "steady",
    "time_graphs",
    "warm",
]
