"""Step 3 — validate: the parity gate between what was trained and what will be served.

Three checks on the golden texts (the checkpoint's ``golden.txt``, else the built-in set):

1. tokenizer parity — the training framework's tokenizer (PaddleNLP's; for a transformers
   checkpoint ``transformers``' own, the slow one from the trained vocabulary when present) vs the
   serving tokenizer (``seqcls_text.py``, the very file Triton runs, on ``vocab.txt`` or the
   exported ``tokenizer.json``) must give identical ids;
2. numeric parity — Paddle Inference on the static model (PyTorch eager for transformers) vs ONNX
   Runtime on the ONNX model (CUDA execution provider when available and asked for), logits and
   probabilities within tolerance;
3. decision parity — thresholded label sets identical; only near-threshold samples may differ.

Writes ``parity/report.json``, ``parity/plot.png`` and ``parity/expected.json`` (what the smoke
test asserts the served ensemble answers). A failure raises :class:`GateError` with a
one-paragraph summary; the report stays in ``failed/validate/`` for a person to read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.checkpoints.checkpoint import sha256_file
from seqcls.checkpoints.golden import golden_texts
from seqcls.contract import runtime, shipped
from seqcls.errors import GateError, InputError
from seqcls.frameworks import for_checkpoint
from seqcls.gates import parity
from seqcls.gates.parity import Tolerance
from seqcls.gates.parity_plot import plot
from seqcls.registry.runs import log_parity_evidence
from seqcls.release import verdicts
from seqcls.release.records import (
    OUT_DIRS,
    Expected,
    ExpectedItem,
    ParityReport,
    effective_profile,
    model_inputs,
    profile_words,
    served_onnx,
    serving_tokenizer,
    static_dir,
)
from seqcls.release.workspace import Release, StepResult
from seqcls.spec import EXACT_PROFILES
from seqcls.steps import record_refusal, require

log = logging.getLogger(__name__)

STEP = "validate"
OUT_DIR = OUT_DIRS[STEP]


def reference_runtime(release: Release) -> str:
    """What the served graph is compared with: the training framework's own runtime."""
    return for_checkpoint(release.checkpoint).reference_runtime


def serving_ids(release: Release, texts: Sequence[str]) -> list[list[int]]:
    """Ids from the very tokenizer file Triton's ``tokenizer`` model runs."""
    text_mod = shipped.text(release.settings)
    tok = serving_tokenizer(release).build(text_mod, release.config.max_length)
    return text_mod.encode(tok, texts)


def gate_inputs(release: Release, texts: Sequence[str], records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Everything the gate's outcome depends on (a change re-runs it)."""
    cfg, ckpt = release.config, release.checkpoint
    common = shipped.common_dir(release.settings)
    return {
        "convert_outputs": records["convert"]["outputs"],
        "export_outputs": records["export"]["outputs"],
        "golden": ckpt.golden_sha256 or "builtin",
        "texts": len(texts),
        "vocab": ckpt.files.get("vocab.txt"),
        **{k: getattr(cfg, k) for k in GATE_PARAMS},
        **verdicts.inputs(release, "parity"),
        "serving_code": {m: sha256_file(common / f"{m}.py") for m in shipped.MODULES},
    }


GATE_PARAMS = (
    "max_length",
    "threshold",
    "thresholds",
    "hierarchy",
    "atol",
    "rtol",
    "prob_atol",
    "near_margin",
    "provider",
    "require_gpu",
    "profile",
    "min_decision_agreement",
)


def onnx_session(release: Release) -> tuple[Any, str, Tolerance]:
    """The ORT session on the served graph, the provider it really runs on, and its tolerance."""
    cfg = release.config
    providers = runtime.choose_providers(cfg.provider, cfg.require_gpu)
    session = runtime.session(served_onnx(release.workspace), providers, profile=effective_profile(release))
    ran = session.get_providers()[0]
    if providers[0] == "CUDAExecutionProvider" and ran != "CUDAExecutionProvider":
        msg = f"CUDAExecutionProvider was requested but ONNX Runtime fell back to {ran}"
        if cfg.require_gpu:
            raise GateError(msg + " and require_gpu is set.")
        log.warning("validate: %s", msg)
    tol = Tolerance(cfg.atol, cfg.rtol, cfg.prob_atol)
    return session, ran, tol.scaled(cfg.gpu_tolerance_factor) if ran == "CUDAExecutionProvider" else tol


def check_tokenizer(release: Release, texts: Sequence[str]) -> tuple[dict[str, Any], list[list[int]]]:
    ckpt = release.checkpoint
    ref_ids, reference = for_checkpoint(ckpt).reference_ids(ckpt, texts, release.config.max_length)
    got_ids = serving_ids(release, texts)
    result = parity.compare_ids(texts, ref_ids, got_ids)
    result["reference"] = reference
    result["serving"] = serving_tokenizer(release).kind
    log.info(
        "validate: tokenizer parity (%s vs serving %s) %s (%d/%d texts identical)",
        reference,
        result["serving"],
        "passed" if result["passed"] else "FAILED",
        len(texts) - result["mismatched"],
        len(texts),
    )
    return result, got_ids


def check_numbers(
    release: Release, report: ParityReport, ids: list[list[int]], session, tol: Tolerance, decide_mod
) -> tuple[np.ndarray, np.ndarray]:
    """Paddle Inference (PyTorch eager) vs ONNX Runtime on the same (serving) ids: conversion isolated."""
    ckpt, ws = release.checkpoint, release.workspace
    pad_id = serving_tokenizer(release).pad_id
    l_ref = for_checkpoint(ckpt).reference_logits(
        ckpt, static_dir(ws), ids, input_names=model_inputs(ws), pad_id=pad_id
    )
    l_got = runtime.ort_logits(session, ids, pad_id)
    report.numeric = parity.numeric_report(l_ref, l_got, tol, decide_mod)
    exact = report.profile in EXACT_PROFILES
    report.numeric["gating"] = exact
    log.info(
        "validate: numeric parity on %s — logits max |Δ| %.3g, probs max |Δ| %.3g (%s)",
        report.provider,
        report.numeric.get("logits_max_abs_diff", float("nan")),
        report.numeric.get("prob_max_abs_diff", float("nan")),
        "passed" if report.numeric["passed"] else ("FAILED" if exact else "reported only"),
    )
    return l_ref, l_got


def check_decisions(
    release: Release, report: ParityReport, texts: Sequence[str], p_ref, p_got, thresholds, decide_mod
) -> None:
    cfg = release.config
    dc = parity.decision_report(
        texts, p_ref, p_got, thresholds, list(release.checkpoint.labels), cfg.near_margin, cfg.hierarchy, decide_mod
    )
    if report.profile not in EXACT_PROFILES:  # int8: decisions may move, gated on agreement instead
        dc["passed"] = dc["agreement"] >= cfg.min_decision_agreement
        dc["min_agreement"] = cfg.min_decision_agreement
    report.decisions = dc
    log.info(
        "validate: decisions — %d/%d label sets identical, %d near-threshold, agreement %.4f",
        dc["texts"] - dc["changed"],
        dc["texts"],
        dc["near_threshold"],
        dc["agreement"],
    )


def check_batch_invariance(release: Release, report: ParityReport, texts: Sequence[str], ids, session) -> None:
    """An engine that may share runs between texts (bf16's OpenVINO, in bucket shapes) does so only where no
    answer moves: the golden texts alone vs in random compositions, run shared in bucket shapes (checked
    whether or not this host batches). A failure is not a refusal of the release — the answers validated
    are each text as served alone — but batching is off for this session and the report says why; serving
    decides by its own load-time self-check on its CPU."""
    names = [i.name for i in session.get_inputs()]
    pad_id = serving_tokenizer(release).pad_id

    def run(members: list[int], batching: bool) -> np.ndarray:
        feed = next(runtime.feeds([ids[i] for i in members], names, pad_id, size=len(members)))
        return session.run_rows([0], feed, batching=batching, buckets=session.bucket_set)[0]

    alone = np.concatenate([run([i], False) for i in range(len(ids))])
    result = parity.batch_invariance(texts, alone, lambda members: run(members, True))
    result["engine_self_check"] = session.self_check
    result["serving"] = "batched" if result["passed"] and session.batching else "alone"
    result["why"] = None
    if not result["passed"]:
        first = result["first_difference"] or {}
        result["why"] = (
            f"{result['rows_differing']}/{result['rows_compared']} rows moved when batched (first: text "
            f"#{first.get('index')} by {first.get('max_abs_diff')} with {first.get('batch', 0) - 1} others)"
        )
    elif not session.batching:
        result["why"] = session.refusal
    session.batching = session.batching and result["passed"]
    report.batch_invariance = result
    log.log(
        logging.INFO if result["passed"] else logging.WARNING,
        "validate: batch invariance on %s — %d/%d rows bit-identical in %d compositions; texts served %s%s",
        report.provider,
        result["rows_compared"] - result["rows_differing"],
        result["rows_compared"],
        result["compositions"],
        result["serving"],
        f" ({result['why']})" if result["why"] else "",
    )


def expected_answers(
    release: Release, texts: Sequence[str], ids: list[list[int]], session, thresholds, tol: Tolerance, decide_mod
) -> Expected:
    """What the served ensemble must answer: each text alone, as a single-text request is padded
    (quantised models move with padding, so batched outputs would not be what is served)."""
    cfg = release.config
    labels = list(release.checkpoint.labels)
    p_alone = decide_mod.sigmoid(np.concatenate([runtime.ort_logits(session, [x]) for x in ids]))
    decisions = decide_mod.decide(p_alone, thresholds, labels, hierarchy=cfg.hierarchy)
    near = decide_mod.near_threshold(p_alone, thresholds, cfg.near_margin)
    items = [
        ExpectedItem(t, [d[0] for d in dec], [round(d[1], 6) for d in dec], [round(float(x), 7) for x in p], bool(n))
        for t, dec, p, n in zip(texts, decisions, p_alone, near, strict=True)
    ]
    return Expected(
        labels=labels,
        thresholds=[float(t) for t in thresholds],
        hierarchy=cfg.hierarchy,
        max_length=cfg.max_length,
        prob_atol=max(tol.prob_atol_effective * 10, 1e-4),  # another process, other thread counts
        gate="exact" if effective_profile(release) in EXACT_PROFILES else "agreement",
        min_agreement=cfg.min_decision_agreement,
        items=items,
    )


def run_gate(release: Release, texts: list[str], source: str, out: Path) -> tuple[dict, str]:
    """The gate itself: tokenizer, numbers, decisions; report + plot always, expected answers if passed."""
    cfg, ckpt = release.config, release.checkpoint
    decide_mod = shipped.decide(release.settings)
    thresholds = decide_mod.threshold_vector(list(ckpt.labels), cfg.threshold, cfg.thresholds)
    report = ParityReport(cfg.model_name, ckpt.fingerprint, source, len(texts), effective_profile(release))
    t0 = time.perf_counter()
    log.info("validate: %d golden texts (%s), max_length %d", len(texts), source, cfg.max_length)
    report.tokenizer, ids = check_tokenizer(release, texts)
    session, report.provider, tol = onnx_session(release)
    l_ref, l_got = check_numbers(release, report, ids, session, tol, decide_mod)
    p_ref, p_got = decide_mod.sigmoid(l_ref), decide_mod.sigmoid(l_got)
    check_decisions(release, report, texts, p_ref, p_got, thresholds, decide_mod)
    if hasattr(session, "run_rows"):  # an engine that may batch texts (bf16): the batch-invariance criterion
        check_batch_invariance(release, report, texts, ids, session)
    exact = report.profile in EXACT_PROFILES
    report.thresholds = {lbl: float(t) for lbl, t in zip(ckpt.labels, thresholds, strict=True)}
    report.seconds = round(time.perf_counter() - t0, 3)
    report.passed = bool(
        report.tokenizer["passed"] and report.decisions["passed"] and (report.numeric["passed"] or not exact)
    )
    report.save(out)
    title = (
        f"{cfg.model_name} {ckpt.short_fingerprint}: {reference_runtime(release)} vs ONNX Runtime ({report.provider})"
    )
    plot(out / "plot.png", p_ref, p_got, l_ref, l_got, title)
    override = None
    if not report.passed:
        refusal = GateError(failure_paragraph(release, report, str(release.workspace.path(f"failed/{STEP}"))))
        override = verdicts.override_for(release, "parity", refusal)
        if override is None:
            raise refusal
    expected_answers(release, texts, ids, session, thresholds, tol, decide_mod).save(out)
    dc = report.decisions
    summary = {
        **({"overridden": True, "override": override} if override else {}),
        "provider": report.provider,
        "texts": report.texts,
        "golden_source": report.golden_source,
        "passed": report.passed,
        "logits_max_abs_diff": report.numeric.get("logits_max_abs_diff"),
        "prob_max_abs_diff": report.numeric.get("prob_max_abs_diff"),
        "decision_agreement": dc["agreement"],
        "near_threshold": dc["near_threshold"],
        "tokenizer_mismatches": report.tokenizer["mismatched"],
    }
    if override:
        return summary, f"OVERRIDDEN by {override['by']} ({override['reason']}): {override['verdict']}"
    msg = (
        f"gate passed on {len(texts)} texts ({report.provider}): tokenizer ids identical, logits max |Δ| "
        f"{summary['logits_max_abs_diff']:.2e}, decisions {dc['texts'] - dc['changed']}/{dc['texts']} "
        f"identical ({dc['near_threshold']} near threshold)"
    )
    return summary, msg


def failure_paragraph(release: Release, report: ParityReport, where: str) -> str:
    """One paragraph naming every failed check with its figures, and where the full report is."""
    parts = []
    tk = report.tokenizer
    if not tk["passed"]:
        m = tk["first_mismatch"]
        parts.append(
            f"tokenizer ids differ on {tk['mismatched']}/{tk['texts']} texts (first: #{m['index']} "
            f"{m['text'][:40]!r}: {tk.get('reference', 'paddlenlp')} {m['reference'][:12]} vs serving "
            f"{tk.get('serving', 'tokenizer')} {m['serving'][:12]})"
        )
    nm = report.numeric
    if nm and not nm.get("passed", True):
        if not nm.get("finite", True):
            parts.append(f"non-finite outputs {nm.get('nan_or_inf')}")
        else:
            parts.append(
                f"logits max |Δ| {nm['logits_max_abs_diff']:.3g} (atol {nm['atol']}, rtol {nm['rtol']}: "
                f"{nm['logits_out_of_tolerance']} values out), probabilities max |Δ| "
                f"{nm['prob_max_abs_diff']:.3g} ({nm['prob_out_of_tolerance']} out; {nm['prob_tolerance']})"
            )
    dc = report.decisions
    if dc and not dc.get("passed", True):
        first = next((c for c in dc["changes"] if not c["near_threshold"]), dc["changes"][0] if dc["changes"] else None)
        ref = reference_runtime(release)
        detail = f" (first: #{first['index']} {ref} {first['paddle']} vs ORT {first['onnxruntime']})" if first else ""
        parts.append(
            f"{dc['changed']} label sets changed, {dc['changed_not_near_threshold']} not near a "
            f"threshold{detail}; agreement {dc['agreement']:.4f}"
        )
    for extra in report.gate_errors:
        parts.append(extra)
    return (
        f"Parity gate failed for model {release.config.model_name!r} (fingerprint "
        f"{release.checkpoint.short_fingerprint}, profile {profile_words(release)}, provider "
        f"{report.provider}): " + "; ".join(parts) + f". Nothing was registered or published. "
        f"Full report: {where}/report.json and plot.png."
    )


def check_max_length(release: Release) -> None:
    """``max_length`` must fit the checkpoint's position embeddings, or the served model would
    refuse (or mis-embed) every text tokenized to more than ``max_position_embeddings`` tokens."""
    max_length, positions = release.config.max_length, release.checkpoint.max_position_embeddings
    if max_length > positions:
        raise InputError(
            f"max_length={max_length} is larger than the checkpoint's max_position_embeddings={positions} "
            f"({release.checkpoint.origin / release.checkpoint.config_file.name}): the model cannot embed more "
            f"than {positions} positions. Release with --max-length {positions} (the max_length param) or less."
        )


def validate(release: Release) -> StepResult:
    """Run the parity gate; on success the expected decisions are ready for the smoke test."""
    check_max_length(release)
    records = require(release, STEP)
    texts, source = golden_texts(release.checkpoint)
    inputs = gate_inputs(release, texts, records)
    try:
        result = release.workspace.run_step(
            STEP, inputs, lambda out: run_gate(release, texts, source, out), out_dir=OUT_DIR
        )
    except GateError as exc:
        log_parity_evidence(release, "failed")  # the MLflow run holds the failed gate's report + plot
        record_refusal(release, "parity", exc)  # the serving log (`seqcls history`); never raises
        raise
    if result.status == "ok":  # ran now (a skipped step's evidence was logged when it ran)
        override = result.summary.get("override")
        log_parity_evidence(release, "overridden" if override else "passed")
        if override:
            verdicts.record_override(release, override)  # the serving log (`seqcls history`); never raises
    return result
