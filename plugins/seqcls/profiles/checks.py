"""What every serving profile is checked against: the graph's I/O contract, synthetic padded
batches, the exact self-check (``fp32-fused``) and label-decision agreement (``int8``).

The graph's id inputs are its own: any subset of the contract's ``MODEL_INPUT_NAMES``
(``input_ids`` always; PaddleNLP's ERNIE adds ``token_type_ids``, HF BERT also
``attention_mask``, DeBERTa-v2 ``input_ids`` + ``attention_mask``), int64 ``[batch, seq]``. The
contract check and every feed built here (self-check, calibration) use exactly those.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.config import ReleaseConfig
from seqcls.contract import shipped
from seqcls.errors import ConversionError
from seqcls.profiles.fusion import constants, scalar

#: Self-check tolerance for ``fp32-fused`` — the parity gate's defaults.
SELF_CHECK_ATOL: float = ReleaseConfig.atol
SELF_CHECK_RTOL: float = ReleaseConfig.rtol


# ----------------------------------------------------------------------------- the graph's I/O


def output_name() -> str:
    return shipped.contract().LOGITS_OUTPUT


def graph_inputs(model) -> tuple[str, ...]:
    """The id tensors ``model`` declares, in the contract's order (initializers listed as inputs
    by old exporters are not inputs). Raises if it declares one the contract does not know."""
    known = tuple(shipped.contract().MODEL_INPUT_NAMES)
    weights = {t.name for t in model.graph.initializer}
    declared = [i.name for i in model.graph.input if i.name not in weights]
    unknown = [n for n in declared if n not in known]
    if unknown:
        raise ConversionError(f"optimize: graph inputs {unknown} are not in the serving contract {list(known)}")
    return tuple(n for n in known if n in declared)


def check_contract(model, where: str, expected: Sequence[str]) -> None:
    """The graph takes exactly ``expected`` (int64 ``[batch, seq]``) and returns only ``logits``."""
    from onnx import TensorProto

    out_name = output_name()
    weights = {t.name for t in model.graph.initializer}
    inputs = {i.name: i.type.tensor_type for i in model.graph.input if i.name not in weights}
    problems = []
    if "input_ids" not in expected:
        problems.append(f"inputs {list(expected)} lack 'input_ids'")
    for name in expected:
        t = inputs.get(name)
        if t is None:
            problems.append(f"input {name!r} missing")
        elif t.elem_type != TensorProto.INT64 or len(t.shape.dim) != 2:
            problems.append(f"input {name!r} is no longer int64 [batch, seq]")
    extra = sorted(set(inputs) - set(expected))
    if extra:
        problems.append(f"unexpected inputs {extra}")
    outputs = [o.name for o in model.graph.output]
    if outputs != [out_name]:
        problems.append(f"outputs {outputs}, expected [{out_name!r}]")
    if problems:
        raise ConversionError(f"optimize ({where}): " + "; ".join(problems))


def feeds_for(input_names: Sequence[str], ids: np.ndarray, lengths: Sequence[int]) -> dict[str, np.ndarray]:
    """The feed of a graph taking ``input_names`` for right-padded ``ids`` ([N, L] int64) whose
    rows hold ``lengths`` real tokens: ``attention_mask`` 1 on them and 0 on padding,
    ``token_type_ids`` zeros (one segment)."""
    feeds = {"input_ids": ids}
    if "token_type_ids" in input_names:
        feeds["token_type_ids"] = np.zeros_like(ids)
    if "attention_mask" in input_names:
        feeds["attention_mask"] = (np.arange(ids.shape[1])[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
    return {k: v for k, v in feeds.items() if k in input_names}


def _vocab_and_pad(model) -> tuple[int, int]:
    """The word-embedding rows and the pad id the graph compares ids with (defaults 100, 0)."""
    graph = model.graph
    consts = constants(graph)
    vocab, pad = 100, 0
    for node in graph.node:
        if node.op_type in ("Gather", "EmbedLayerNormalization") and "input_ids" in node.input:
            table_name = node.input[0] if node.op_type == "Gather" else node.input[2]
            table = consts.get(table_name)
            if table is not None and table.ndim == 2:
                vocab = int(table.shape[0])
        if node.op_type == "Equal" and "input_ids" in node.input:
            other = [scalar(consts, x) for x in node.input if x != "input_ids"]
            if other and other[0] is not None:
                pad = int(other[0])
    return vocab, pad


def synthetic_batches(model, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Padded id batches within the model's vocabulary (right padding with the model's pad id),
    for the inputs the graph declares."""
    names = graph_inputs(model)
    vocab, pad = _vocab_and_pad(model)
    rng = np.random.default_rng(seed)
    batches = []
    for batch, seq in ((1, 9), (3, 24), (8, 64)):
        ids = rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)
        ids[ids == pad] = (pad + 1) % vocab
        lengths = [seq] + [int(rng.integers(2, seq)) for _ in range(1, batch)]  # row 0 full length
        for row, n in enumerate(lengths):
            ids[row, n:] = pad
        batches.append(feeds_for(names, ids, lengths))
    return batches


# ----------------------------------------------------------------------------- checks


CPU = ("CPUExecutionProvider",)


def session(path: Path, threads: int = 1, providers: Sequence[str] = CPU):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=opts, providers=list(providers))


def self_check(
    reference: Path, candidate: Path, batches: list[dict[str, np.ndarray]], providers: Sequence[str] = CPU
) -> dict[str, float]:
    """Max |Δ| and the worst tolerance ratio (|Δ| / (atol + rtol·|ref|)) of ``candidate`` vs ``reference``
    (the reference on the CPU, the candidate on ``providers``: fp16 runs on CUDA only)."""
    out_name = output_name()
    ref, got = session(reference), session(candidate, providers=providers)
    worst_abs, worst_ratio = 0.0, 0.0
    for feeds in batches:
        a = ref.run([out_name], feeds)[0]
        b = got.run([out_name], feeds)[0]
        diff = np.abs(a.astype(np.float64) - b)
        worst_abs = max(worst_abs, float(diff.max(initial=0.0)))
        worst_ratio = max(worst_ratio, float((diff / (SELF_CHECK_ATOL + SELF_CHECK_RTOL * np.abs(a))).max(initial=0.0)))
    return {"logits_max_abs_diff": worst_abs, "tolerance_ratio": worst_ratio}


def reference_logits(reference: Path, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """``reference``'s logits (fp64) for each of ``feeds``: computed once when several candidates
    are checked against the same graph (the INT8 ladder's recipes)."""
    out_name = output_name()
    ref = session(reference, threads=2)
    return [ref.run([out_name], f)[0].astype(np.float64) for f in feeds]


def decision_agreement(
    reference: Path | list[np.ndarray],
    candidate: Path,
    feeds: list[dict[str, np.ndarray]],
    threshold: float = 0.5,
    providers: Sequence[str] = CPU,
) -> dict[str, Any]:
    """Label-decision agreement of ``candidate`` (on ``providers``) vs ``reference`` (a graph, or its
    :func:`reference_logits` for ``feeds``), logit > logit(threshold), over ``feeds``: the gate's
    measure without its hierarchy closure, plus max |Δprob|."""
    out_name = output_name()
    expected = reference_logits(reference, feeds) if isinstance(reference, Path) else reference
    if len(expected) != len(feeds):
        raise ValueError(f"{len(expected)} reference outputs for {len(feeds)} feeds")
    got = session(candidate, threads=2, providers=providers)
    cut = float(np.log(threshold / (1.0 - threshold)))
    changed = total = rows_changed = rows = 0
    worst = 0.0
    for a, f in zip(expected, feeds, strict=True):
        b = got.run([out_name], f)[0].astype(np.float64)
        flips = (a > cut) != (b > cut)
        changed += int(flips.sum())
        total += flips.size
        rows_changed += int(flips.any(axis=1).sum())
        rows += flips.shape[0]
        worst = max(worst, float(np.abs(1 / (1 + np.exp(-a)) - 1 / (1 + np.exp(-b))).max(initial=0.0)))
    return {
        "agreement": round(1.0 - changed / max(total, 1), 6),
        "rows_changed": rows_changed,
        "rows": rows,
        "prob_max_abs_diff": round(worst, 5),
    }
