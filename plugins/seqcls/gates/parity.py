"""The parity gate's numbers: tokenizer ids, logits, probabilities, decisions — no orchestration.

:mod:`seqcls.steps.validate` decides *what* to compare and records the outcome; this module only
computes, so each check can be tested (and rerun by a person) on its own.

Tolerances are derived from one another. The gate is on logits: ``|Δ| <= atol + rtol·|x|``.
Sigmoid's slope is at most 1/4, so logits inside that bound move a probability by at most
``(atol + rtol·|x|) / 4`` — that is the probability tolerance unless ``prob_atol`` is set, in
which case it is an *additional*, stricter requirement the user asked for. (The old fixed
``prob_atol=1e-5`` rejected models the logit tolerance accepted: logits within 4.2e-5 moved a
probability by 1.05e-5.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.errors import GateError
from seqcls.serving import shipped
from seqcls.steps.export import static_model_files

BATCH = 16
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


def paddlenlp_ids(checkpoint_dir: Path, texts: Sequence[str], max_length: int) -> list[list[int]]:
    from paddlenlp.transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(checkpoint_dir))
    enc = tok(list(texts), max_length=max_length, truncation=True, padding=False)
    return [list(map(int, ids)) for ids in enc["input_ids"]]


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


def feeds(ids: Sequence[Sequence[int]], names: Sequence[str], pad_id: int = 0, size: int = BATCH):
    """Batches of ``{input name: [N, L] int64}`` for a graph taking ``names`` (the serving padding)."""
    text_mod = shipped.text()
    for start in range(0, len(ids), size):
        yield text_mod.model_feeds(ids[start : start + size], names, strategy="longest", pad_id=pad_id)


def paddle_logits(static_dir: Path, ids: Sequence[Sequence[int]], threads: int = 2) -> np.ndarray:
    import paddle.inference as paddle_infer

    model_file, params_file = static_model_files(static_dir)
    cfg = paddle_infer.Config(str(model_file), str(params_file))
    cfg.disable_gpu()
    cfg.set_cpu_math_library_num_threads(threads)
    cfg.disable_glog_info()
    predictor = paddle_infer.create_predictor(cfg)
    names = predictor.get_input_names()
    out = []
    for feed in feeds(ids, shipped.contract().MODEL_INPUTS):
        for name in names:
            handle = predictor.get_input_handle(name)
            handle.reshape(list(feed[name].shape))
            handle.copy_from_cpu(feed[name])
        predictor.run()
        out.append(predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu())
    return np.concatenate(out).astype(np.float32)


def choose_providers(provider: str, require_gpu: bool) -> list[str]:
    """ORT providers for the requested kind; ``require_gpu`` turns a missing CUDA EP into a gate failure."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    has_cuda = "CUDAExecutionProvider" in available
    if require_gpu and not has_cuda:
        raise GateError(
            f"require_gpu is set but ONNX Runtime offers no CUDAExecutionProvider (available: {available}); "
            "install onnxruntime-gpu on a GPU machine (requirements-gpu.txt) or unset require_gpu."
        )
    if provider == "cuda" and not has_cuda:
        raise GateError(f"provider 'cuda' asked for, but ONNX Runtime offers only {available}.")
    if provider in ("cuda", "auto") and has_cuda:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def ort_session(onnx_path: Path, providers: list[str], threads: int = 2):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(onnx_path), sess_options=opts, providers=providers)


def ort_logits(session, ids: Sequence[Sequence[int]], pad_id: int = 0) -> np.ndarray:
    """ONNX Runtime's logits, fed exactly the inputs the graph declares."""
    c = shipped.contract()
    names = [i.name for i in session.get_inputs()]
    out = [session.run([c.LOGITS_OUTPUT], f)[0] for f in feeds(ids, names, pad_id)]
    return np.concatenate(out).astype(np.float32)


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


def plot(path: Path, p_ref: np.ndarray, p_got: np.ndarray, l_ref: np.ndarray, l_got: np.ndarray, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    ax1.scatter(p_ref.ravel(), p_got.ravel(), s=6, alpha=0.5)
    ax1.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
    ax1.set_xlabel("Paddle Inference probability")
    ax1.set_ylabel("ONNX Runtime probability")
    ax1.set_title("probabilities per (text, label)")
    d = np.abs(l_ref - l_got).ravel()
    d = np.where(d > 0, d, 1e-12)
    ax2.hist(np.log10(d), bins=40, color="tab:orange")
    ax2.set_xlabel("log10 |Δ logit|  (exact zero shown at -12)")
    ax2.set_ylabel("count")
    ax2.set_title(f"|Δ| distribution, max {float(np.abs(l_ref - l_got).max(initial=0)):.2e}")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
