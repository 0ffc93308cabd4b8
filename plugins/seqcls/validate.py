"""Step 3 — validate: the parity gate between what was trained and what will be served.

Three checks on the golden texts (the checkpoint's ``golden.txt``, else the built-in set):

1. tokenizer parity — PaddleNLP's tokenizer vs the serving tokenizer (``seqcls_text.py``, the
   very file Triton runs) must give identical ids;
2. numeric parity — Paddle Inference on the static model vs ONNX Runtime on the ONNX model
   (CUDA execution provider when available and asked for), logits and probabilities within
   tolerance;
3. decision parity — thresholded label sets identical; only near-threshold samples may differ.

Writes ``parity/report.json``, ``parity/plot.png`` and ``parity/expected.json`` (what the smoke
test asserts the served ensemble answers). A failure raises :class:`GateError` with a
one-paragraph summary; the report stays in ``failed/validate/`` for a person to read.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqcls import shipped
from seqcls.errors import GateError
from seqcls.export import static_model_files
from seqcls.golden import DEFAULT_GOLDEN_TEXTS
from seqcls.workspace import Release, StepResult

log = logging.getLogger(__name__)

STEP = "validate"
OUT_DIR = "parity"
BATCH = 16


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    prob_atol: float


def served_onnx(release: Release) -> Path:
    """The ONNX file serving runs: ``onnx/model.onnx`` (fp32) or the profile's ``onnx/served.onnx``."""
    served = release.workspace.path("onnx/served.onnx")
    return (
        served if release.config.profile != "fp32" and served.is_file() else release.workspace.path("onnx/model.onnx")
    )


def golden_texts(release: Release) -> tuple[list[str], str]:
    if release.checkpoint.golden_texts:
        return list(release.checkpoint.golden_texts), "checkpoint golden.txt"
    return list(DEFAULT_GOLDEN_TEXTS), "built-in golden set"


# --- tokenizer parity --------------------------------------------------------------------------


def paddlenlp_ids(checkpoint_dir: Path, texts: Sequence[str], max_length: int) -> list[list[int]]:
    from paddlenlp.transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(checkpoint_dir))
    enc = tok(list(texts), max_length=max_length, truncation=True, padding=False)
    return [list(map(int, ids)) for ids in enc["input_ids"]]


def serving_ids(release: Release, texts: Sequence[str]) -> list[list[int]]:
    text_mod = shipped.text(release.settings)
    tok = text_mod.build_tokenizer(
        release.checkpoint.vocab_file, lowercase=release.checkpoint.do_lower_case, max_length=release.config.max_length
    )
    return text_mod.encode(tok, texts)


def compare_ids(texts: Sequence[str], ref: Sequence[Sequence[int]], got: Sequence[Sequence[int]]) -> dict[str, Any]:
    diffs = [i for i, (a, b) in enumerate(zip(ref, got, strict=True)) if list(a) != list(b)]
    out: dict[str, Any] = {"texts": len(texts), "mismatched": len(diffs), "passed": not diffs}
    if diffs:
        i = diffs[0]
        out["first_mismatch"] = {
            "index": i,
            "text": texts[i][:200],
            "paddlenlp": list(ref[i])[:64],
            "serving": list(got[i])[:64],
        }
    return out


# --- numeric parity ----------------------------------------------------------------------------


def batches(ids: Sequence[Sequence[int]], size: int = BATCH):
    text_mod = shipped.text()  # same cached module object the release loaded
    for start in range(0, len(ids), size):
        yield text_mod.pad(ids[start : start + size], strategy="longest")


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
    for input_ids, type_ids in batches(ids):
        feeds = {"input_ids": input_ids, "token_type_ids": type_ids}
        for name in names:
            handle = predictor.get_input_handle(name)
            handle.reshape(list(feeds[name].shape))
            handle.copy_from_cpu(feeds[name])
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


def ort_logits(session, ids: Sequence[Sequence[int]]) -> np.ndarray:
    out = [session.run(["logits"], {"input_ids": a, "token_type_ids": b})[0] for a, b in batches(ids)]
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
    bad = diff > (tol.atol + tol.rtol * np.abs(ref))
    report.update(
        {
            "logits_max_abs_diff": float(diff.max(initial=0.0)),
            "logits_mean_abs_diff": float(diff.mean()) if diff.size else 0.0,
            "logits_max_rel_diff": float(rel.max(initial=0.0)),
            "prob_max_abs_diff": float(pdiff.max(initial=0.0)),
            "logits_out_of_tolerance": int(bad.sum()),
            "prob_out_of_tolerance": int((pdiff > tol.prob_atol).sum()),
            "atol": tol.atol,
            "rtol": tol.rtol,
            "prob_atol": tol.prob_atol,
        }
    )
    report["passed"] = report["logits_out_of_tolerance"] == 0 and report["prob_out_of_tolerance"] == 0
    return report


# --- decision parity ---------------------------------------------------------------------------


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


def _summary_paragraph(release: Release, report: dict[str, Any], where: str) -> str:
    parts = []
    tk = report["tokenizer"]
    if not tk["passed"]:
        m = tk["first_mismatch"]
        parts.append(
            f"tokenizer ids differ on {tk['mismatched']}/{tk['texts']} texts (first: #{m['index']} "
            f"{m['text'][:40]!r}: paddlenlp {m['paddlenlp'][:12]} vs serving {m['serving'][:12]})"
        )
    nm = report.get("numeric", {})
    if nm and not nm.get("passed", True):
        if not nm.get("finite", True):
            parts.append(f"non-finite outputs {nm.get('nan_or_inf')}")
        else:
            parts.append(
                f"logits max |Δ| {nm['logits_max_abs_diff']:.3g} (atol {nm['atol']}, rtol {nm['rtol']}: "
                f"{nm['logits_out_of_tolerance']} values out), probabilities max |Δ| "
                f"{nm['prob_max_abs_diff']:.3g} (prob_atol {nm['prob_atol']})"
            )
    dc = report.get("decisions", {})
    if dc and not dc.get("passed", True):
        first = next((c for c in dc["changes"] if not c["near_threshold"]), dc["changes"][0] if dc["changes"] else None)
        detail = f" (first: #{first['index']} paddle {first['paddle']} vs ORT {first['onnxruntime']})" if first else ""
        parts.append(
            f"{dc['changed']} label sets changed, {dc['changed_not_near_threshold']} not near a "
            f"threshold{detail}; agreement {dc['agreement']:.4f}"
        )
    for extra in report.get("gate_errors", []):
        parts.append(extra)
    return (
        f"Parity gate failed for model {release.config.model_name!r} (fingerprint "
        f"{release.checkpoint.short_fingerprint}, profile {release.config.profile}, provider "
        f"{report.get('provider')}): " + "; ".join(parts) + f". Nothing was registered or published. "
        f"Full report: {where}/report.json and plot.png."
    )


def validate(release: Release) -> StepResult:
    """Run the parity gate; on success the expected decisions are ready for the smoke test."""
    ws, cfg, ckpt = release.workspace, release.config, release.checkpoint
    convert_rec = ws.require("convert")
    ws.require("export")
    texts, source = golden_texts(release)
    text_file = shipped.common_dir(release.settings) / "seqcls_text.py"
    decide_file = shipped.common_dir(release.settings) / "seqcls_decide.py"
    from seqcls.checkpoint import sha256_file

    inputs = {
        "convert_outputs": convert_rec["outputs"],
        "export_outputs": ws.step("export")["outputs"],
        "golden": ckpt.golden_sha256 or "builtin",
        "texts": len(texts),
        "vocab": ckpt.files.get("vocab.txt"),
        "max_length": cfg.max_length,
        "threshold": cfg.threshold,
        "thresholds": cfg.thresholds,
        "hierarchy": cfg.hierarchy,
        "atol": cfg.atol,
        "rtol": cfg.rtol,
        "prob_atol": cfg.prob_atol,
        "near_margin": cfg.near_margin,
        "provider": cfg.provider,
        "require_gpu": cfg.require_gpu,
        "profile": cfg.profile,
        "min_decision_agreement": cfg.min_decision_agreement,
        "serving_code": {"seqcls_text": sha256_file(text_file), "seqcls_decide": sha256_file(decide_file)},
    }

    def body(out: Path) -> tuple[dict, str]:
        decide_mod = shipped.decide(release.settings)
        labels = list(ckpt.labels)
        thresholds = decide_mod.threshold_vector(labels, cfg.threshold, cfg.thresholds)
        report: dict[str, Any] = {
            "model_name": cfg.model_name,
            "fingerprint": ckpt.fingerprint,
            "golden_source": source,
            "texts": len(texts),
            "profile": cfg.profile,
        }
        t0 = time.perf_counter()
        log.info("validate: %d golden texts (%s), max_length %d", len(texts), source, cfg.max_length)
        ref_ids = paddlenlp_ids(ckpt.path, texts, cfg.max_length)
        got_ids = serving_ids(release, texts)
        report["tokenizer"] = compare_ids(texts, ref_ids, got_ids)
        log.info(
            "validate: tokenizer parity %s (%d/%d texts identical)",
            "passed" if report["tokenizer"]["passed"] else "FAILED",
            len(texts) - report["tokenizer"]["mismatched"],
            len(texts),
        )
        providers = choose_providers(cfg.provider, cfg.require_gpu)
        session = ort_session(served_onnx(release), providers)
        ran = session.get_providers()[0]
        report["provider"] = ran
        if providers[0] == "CUDAExecutionProvider" and ran != "CUDAExecutionProvider":
            msg = f"CUDAExecutionProvider was requested but ONNX Runtime fell back to {ran}"
            if cfg.require_gpu:
                raise GateError(msg + " and require_gpu is set.")
            log.warning("validate: %s", msg)
        factor = cfg.gpu_tolerance_factor if ran == "CUDAExecutionProvider" else 1.0
        tol = Tolerance(cfg.atol * factor, cfg.rtol * factor, cfg.prob_atol * factor)
        # Both engines see the same (serving) ids, so numeric parity isolates the model conversion.
        l_ref = paddle_logits(ws.path("static"), got_ids)
        l_got = ort_logits(session, got_ids)
        p_ref, p_got = decide_mod.sigmoid(l_ref), decide_mod.sigmoid(l_got)
        report["numeric"] = numeric_report(l_ref, l_got, tol, decide_mod)
        exact = cfg.profile in ("fp32", "fp32-fused")
        report["numeric"]["gating"] = exact
        log.info(
            "validate: numeric parity on %s — logits max |Δ| %.3g, probs max |Δ| %.3g (%s)",
            ran,
            report["numeric"].get("logits_max_abs_diff", float("nan")),
            report["numeric"].get("prob_max_abs_diff", float("nan")),
            "passed" if report["numeric"]["passed"] else ("FAILED" if exact else "reported only"),
        )
        report["decisions"] = decision_report(
            texts, p_ref, p_got, thresholds, labels, cfg.near_margin, cfg.hierarchy, decide_mod
        )
        dc = report["decisions"]
        if not exact:  # int8: decisions may move, gated on agreement instead of exactness
            dc["passed"] = dc["agreement"] >= cfg.min_decision_agreement
            dc["min_agreement"] = cfg.min_decision_agreement
        log.info(
            "validate: decisions — %d/%d label sets identical, %d near-threshold, agreement %.4f",
            dc["texts"] - dc["changed"],
            dc["texts"],
            dc["near_threshold"],
            dc["agreement"],
        )
        report["thresholds"] = {lbl: float(t) for lbl, t in zip(labels, thresholds, strict=True)}
        report["seconds"] = round(time.perf_counter() - t0, 3)
        report["passed"] = bool(
            report["tokenizer"]["passed"] and dc["passed"] and (report["numeric"]["passed"] or not exact)
        )
        (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
        plot(
            out / "plot.png",
            p_ref,
            p_got,
            l_ref,
            l_got,
            f"{cfg.model_name} {ckpt.short_fingerprint}: Paddle vs ONNX Runtime ({ran})",
        )
        if not report["passed"]:
            raise GateError(_summary_paragraph(release, report, str(ws.path(f"failed/{STEP}"))))
        # Expected answers as served: each text alone (a single-text request is padded to itself;
        # quantised models move with padding, so batched-16 outputs would not be what is served).
        p_alone = decide_mod.sigmoid(np.concatenate([ort_logits(session, [ids]) for ids in got_ids]))
        decisions = decide_mod.decide(p_alone, thresholds, labels, hierarchy=cfg.hierarchy)
        near = decide_mod.near_threshold(p_alone, thresholds, cfg.near_margin)
        expected = {
            "labels": labels,
            "thresholds": [float(t) for t in thresholds],
            "hierarchy": cfg.hierarchy,
            "max_length": cfg.max_length,
            "prob_atol": max(tol.prob_atol * 10, 1e-4),
            "gate": "exact" if exact else "agreement",
            "min_agreement": cfg.min_decision_agreement,
            "items": [
                {
                    "text": t,
                    "labels": [d[0] for d in dec],
                    "confidences": [round(d[1], 6) for d in dec],
                    "probabilities": [round(float(x), 7) for x in p],
                    "near_threshold": bool(n),
                }
                for t, dec, p, n in zip(texts, decisions, p_alone, near, strict=True)
            ],
        }
        (out / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False), encoding="utf-8")
        summary = {k: report[k] for k in ("provider", "texts", "golden_source", "passed")}
        summary.update(
            {
                "logits_max_abs_diff": report["numeric"].get("logits_max_abs_diff"),
                "prob_max_abs_diff": report["numeric"].get("prob_max_abs_diff"),
                "decision_agreement": dc["agreement"],
                "near_threshold": dc["near_threshold"],
                "tokenizer_mismatches": report["tokenizer"]["mismatched"],
            }
        )
        msg = (
            f"gate passed on {len(texts)} texts ({ran}): tokenizer ids identical, logits max |Δ| "
            f"{summary['logits_max_abs_diff']:.2e}, decisions {dc['texts'] - dc['changed']}/{dc['texts']} "
            f"identical ({dc['near_threshold']} near threshold)"
        )
        return summary, msg

    return ws.run_step(STEP, inputs, body, out_dir=OUT_DIR)
