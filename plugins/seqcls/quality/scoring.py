"""Labeled texts through a served graph, as Triton answers them: the candidate's, the fp32 graph's, the champion's.

The quality gate judges what is served, not what was trained: the serving tokenizer
(``seqcls_text``, the file Triton's ``tokenizer`` model runs), the ONNX graph of the chosen profile
under ONNX Runtime, and the decision rule of ``seqcls_decide`` (thresholds, hierarchy). The
champion is re-scored from the files of its *published* Triton version — eval sets change, so a
number stored at its release says nothing about today's set — each file copied once into a scratch
directory, hashed as it is copied and checked against the hash its ``release.json`` recorded at
publish: what is scored is what Triton loaded, or the gate refuses.

A quantised graph (any profile but ``fp32``/``fp32-fused``) is run one text at a time, as
``seqcls_model`` serves it (its answers move with padding); exact graphs in batches.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.config import EXACT_PROFILES
from seqcls.errors import ServingError
from seqcls.files import copy_hashed
from seqcls.gates import runtime
from seqcls.serving import shipped
from seqcls.serving.repository import RELEASE_FILE, Repository

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


def _verified_copy(vdir: Path, name: str, recorded: dict[str, str], scratch: Path, what: str) -> Path:
    """``vdir/name`` copied once into ``scratch`` and checked against the hash publish recorded."""
    digest = recorded.get(name)
    if digest is None:
        raise ServingError(f"{vdir / RELEASE_FILE} records no hash for {name}; {what} cannot be verified")
    target = scratch / vdir.parent.name / name
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(vdir / name, "rb") as src:
            got, _ = copy_hashed(src, target)
    except FileNotFoundError:
        raise ServingError(f"{vdir / name} is missing: {what} is damaged; run `seqcls sync`") from None
    if got != digest:
        raise ServingError(
            f"{vdir / name} changed since publish (sha256 {got[:12]} ≠ {digest[:12]}): {what} is damaged; "
            "run `seqcls status` / `seqcls sync`"
        )
    return target


def _info(vdir: Path, what: str) -> dict[str, Any]:
    path = vdir / RELEASE_FILE
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ServingError(f"{path} is missing: {what} cannot be scored; run `seqcls status`") from None
    except ValueError as exc:
        raise ServingError(f"{path} is not JSON ({exc}): {what} cannot be scored") from None


def served_graph(repo: Repository, version: int, scratch: Path) -> Graph:
    """Triton version ``version`` of ``repo``'s model as published: verified copies of its tokenizer and graph."""
    text_mod = shipped.text()
    names, what = repo.names, f"the served version {version} of {repo.model_name}"
    tok_dir, model_dir, post_dir = (
        repo.root / m / str(version) for m in (names.tokenizer, names.model, names.postprocess)
    )
    tok_info, model_info, post_info = _info(tok_dir, what), _info(model_dir, what), _info(post_dir, what)
    tok_file = str(tok_info.get("tokenizer_file") or "vocab.txt")
    tok_path = _verified_copy(tok_dir, tok_file, tok_info.get("files", {}), scratch, what)
    max_length = int(tok_info["max_length"])
    if tok_file == "tokenizer.json":
        tokenizer = text_mod.load_tokenizer(tok_path, max_length=max_length)
    else:
        table = text_mod.CHAR_CLASSES_FILE
        classes = None
        if table in tok_info.get("files", {}):
            classes = text_mod.read_char_classes(_verified_copy(tok_dir, table, tok_info["files"], scratch, what))
        tokenizer = text_mod.build_tokenizer(
            tok_path, lowercase=bool(tok_info.get("do_lower_case", True)), max_length=max_length, classes=classes
        )
    graph_files = sorted(n for n in model_info.get("files", {}) if n.startswith("model.onnx"))
    if "model.onnx" not in graph_files:
        raise ServingError(f"{model_dir / RELEASE_FILE} lists no model.onnx: {what} cannot be scored")
    copies = {n: _verified_copy(model_dir, n, model_info["files"], scratch, what) for n in graph_files}
    onnx = copies["model.onnx"]  # beside it: its external data file, when it has one
    labels = list(post_info["labels"])
    return Graph(
        "champion",
        onnx,
        tokenizer,
        int(tok_info.get("pad_id", 0)),
        labels,
        np.asarray(post_info["thresholds"], dtype=np.float32),
        bool(post_info.get("hierarchy", True)),
        str(post_info.get("profile") or "fp32"),
        version,
    )


def decide_vector(labels: Sequence[str], threshold: float, per_label: dict[str, float]) -> np.ndarray:
    """The candidate's threshold per label (the vector publish will write into ``release.json``)."""
    return shipped.decide().threshold_vector(list(labels), threshold, per_label)


__all__ = ["EXACT_PROFILES", "Graph", "Predictions", "decide_vector", "predict", "served_graph"]
