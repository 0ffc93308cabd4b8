"""Labeled texts through a served graph, as Triton answers them: the candidate's, the fp32 graph's, the champion's.

The quality gate judges what is served, not what was trained: the serving tokenizer
(``seqcls_text``, the file Triton's ``tokenizer`` model runs), the ONNX graph of the chosen profile
under ONNX Runtime, and the decision rule of ``seqcls_decide`` (thresholds, hierarchy). The
champion is re-scored from the files of its *published* Triton version
(:func:`seqcls.serving.published.served_graph`): eval sets change, so a number stored at its
release says nothing about today's set.

A quantised graph (any profile but ``fp32``/``fp32-fused``) is run one text at a time, as
``seqcls_model`` serves it (its answers move with padding); exact graphs in batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.contract import runtime, shipped
from seqcls.spec import EXACT_PROFILES

log = logging.getLogger(__name__)


@dataclass
class Graph:
    """What answers: an ONNX graph, the tokenizer that feeds it and how its decision is made."""

    name: str  # "candidate", "fp32", "champion"
    onnx: Path
    tokenizer: Any  # tokenizers.Tokenizer, built by seqcls_text
    pad_id: int
    labels: list[str]
    thresholds: np.ndarray
    hierarchy: bool
    profile: str
    version: int | None = None  # the Triton version (champion)

    @property
    def alone(self) -> bool:
        return self.profile not in EXACT_PROFILES


@dataclass
class Predictions:
    """One graph's answers on the eval set: label sets, each label's probability, and how long it took."""

    name: str
    labels: list[list[str]]
    probabilities: np.ndarray  # [texts, len(model_labels)]
    model_labels: list[str]
    seconds: float
    profile: str
    version: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def confidences(self, row: int, names: Sequence[str]) -> dict[str, float]:
        """This text's probability of each of ``names`` this model knows."""
        index = {lbl: i for i, lbl in enumerate(self.model_labels)}
        return {n: round(float(self.probabilities[row, index[n]]), 6) for n in names if n in index}


def predict(graph: Graph, texts: Sequence[str], providers: list[str]) -> Predictions:
    """``texts`` through ``graph`` as served: serving ids, ONNX Runtime, sigmoid, thresholds, hierarchy."""
    text_mod, decide_mod = shipped.text(), shipped.decide()
    t0 = time.perf_counter()
    ids, truncated = text_mod.encode_counted(graph.tokenizer, list(texts))
    session = runtime.session(graph.onnx, providers, profile=graph.profile)
    if graph.alone:
        logits = np.concatenate([runtime.ort_logits(session, [x], graph.pad_id) for x in ids])
    else:  # batches of similar lengths: little padding to compute (an exact graph answers the same in any batch)
        order = np.argsort([len(x) for x in ids], kind="stable")
        logits = np.empty((len(ids), len(graph.labels)), dtype=np.float32)
        logits[order] = runtime.ort_logits(session, [ids[i] for i in order], graph.pad_id)
    probs = decide_mod.sigmoid(logits)
    rows = decide_mod.decide(probs, graph.thresholds, graph.labels, hierarchy=graph.hierarchy)
    seconds = time.perf_counter() - t0
    log.info(
        "evaluate: %s (%s%s) answered %d texts in %.1fs (%.0f texts/s)",
        graph.name,
        graph.profile,
        f", Triton v{graph.version}" if graph.version is not None else "",
        len(texts),
        seconds,
        len(texts) / max(seconds, 1e-9),
    )
    return Predictions(
        graph.name,
        [[lbl for lbl, _ in row] for row in rows],
        probs,
        list(graph.labels),
        round(seconds, 3),
        graph.profile,
        graph.version,
        {"truncated": truncated},
    )


def decide_vector(labels: Sequence[str], threshold: float, per_label: dict[str, float]) -> np.ndarray:
    """The candidate's threshold per label (the vector publish will write into ``release.json``)."""
    return shipped.decide().threshold_vector(list(labels), threshold, per_label)


__all__ = ["EXACT_PROFILES", "Graph", "Predictions", "decide_vector", "predict"]
