"""Serving profiles beyond plain fp32: offline graph fusion (``fp32-fused``) and INT8 (``int8``).

``convert`` calls :func:`optimize_onnx` for every profile except ``fp32``; the result is
``onnx/served.onnx``, the file that is validated and served. The graph rewrites and ORT's BERT
fusions live in :mod:`seqcls.profiles.fusion` (why paddle2onnx's graph needs them is explained there).

After fusion a self-check (:mod:`seqcls.profiles.checks`) runs the source and the fused model on
synthetic padded batches; ``fp32-fused`` must stay within the exact-parity tolerance (|Δ| ≤ atol
+ rtol·|x|, the gate's defaults in :class:`~seqcls.config.ReleaseConfig`) or the conversion
fails here with the figures. ``int8`` then quantizes the fused model (:mod:`seqcls.profiles.quantize`:
the recipes, the check on the golden texts of :mod:`seqcls.profiles.calibration`, the fallbacks).
``bf16`` writes no graph: it serves ``fp32``'s ``model.onnx`` through OpenVINO at bf16 (``seqcls_engine``);
:func:`check_engine` compiles it so on this CPU (refused without AVX512-BF16 / AMX) and records how far it
moves the logits on the synthetic batches; the parity and quality gates judge it like ``int8``.
``fp16`` (GPU) halves the fused model's weights and activations for the CUDA execution provider.
ONNX Runtime's CPU provider runs fp16 nodes only through casts it inserts (slower than fp32, and not
CUDA's arithmetic), so fp16 is built, self-checked and gated where CUDA is present, and refused on a
CPU-only host before any work is done.

The modules, by responsibility: :mod:`seqcls.profiles.checks` (the graph's I/O contract,
synthetic batches, self-check, decision agreement), :mod:`seqcls.profiles.calibration` (the golden texts
as serving feeds them), :mod:`seqcls.profiles.node_roles` (which nodes a recipe keeps fp32),
:mod:`seqcls.profiles.quantize` (INT8 recipes and the checked ladder). Their public names are also
importable from here.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import seqcls_engine

from seqcls.errors import ConversionError
from seqcls.files import replace_file
from seqcls.profiles.calibration import CALIBRATION_BATCH, Calibration
from seqcls.profiles.checks import (
    CPU,
    SELF_CHECK_ATOL,
    SELF_CHECK_RTOL,
    check_contract,
    decision_agreement,
    feeds_for,
    graph_inputs,
    self_check,
    session,
    synthetic_batches,
)
from seqcls.profiles.fusion import fuse_bert, prepare_for_fusion, raise_opset_for_layernorm
from seqcls.profiles.node_roles import head_nodes, node_roles
from seqcls.profiles.quantize import (
    INT8,
    INT8_FALLBACKS,
    INT8_MARGIN,
    Int8Recipe,
    quantize_checked,
    quantize_int8,
)
from seqcls.spec import ENGINES, NEEDS_PROVIDER, host_refusal

__all__ = [
    "CALIBRATION_BATCH",
    "INT8",
    "INT8_FALLBACKS",
    "INT8_MARGIN",
    "PROFILES",
    "SELF_CHECK_ATOL",
    "SELF_CHECK_RTOL",
    "Calibration",
    "Int8Recipe",
    "check_engine",
    "decision_agreement",
    "feeds_for",
    "graph_inputs",
    "head_nodes",
    "node_roles",
    "optimize_onnx",
    "quantize_int8",
    "self_check",
]

log = logging.getLogger(__name__)

PROFILES = ("fp32-fused", "int8", "fp16")


# ----------------------------------------------------------------------------- the profile


def optimize_onnx(
    src: Path,
    dst: Path,
    profile: str,
    *,
    num_heads: int,
    hidden_size: int,
    calibration: Calibration | None = None,
    recipe: Int8Recipe | None = None,
    providers: Sequence[str] = CPU,
) -> dict:
    """Write the ``profile``'s served model for ``src`` to ``dst``; returns what was done.

    ``fp32-fused``: pre-processing + ORT BERT fusions; ``int8``: the same, then INT8 by
    ``recipe`` (default :data:`INT8`), calibrated on ``calibration`` (the release's golden texts;
    without it a calibrated recipe falls back to synthetic ids, with a warning); ``fp16``: the
    same fusions, then fp16 with inputs, logits and the classifier head kept fp32, self-checked on
    ``providers`` (which must include CUDA). Raises :class:`ConversionError` when a step fails, the
    I/O contract changed, or (fp32-fused) the fused model left the exact-parity tolerance on the
    self-check batches.
    """
    import onnx

    src, dst = Path(src), Path(dst)
    _check_request(src, profile, providers)
    t0 = time.perf_counter()
    model = onnx.load(str(src))
    inputs = graph_inputs(model)
    check_contract(model, "source", inputs)
    batches = synthetic_batches(model)
    optimizer, report = _fuse(model, src.name, profile, inputs, num_heads=num_heads, hidden_size=hidden_size)
    report["inputs"] = list(inputs)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=".optimize-") as tmp:
        out = _write_profile(optimizer, Path(tmp), profile, report, inputs, recipe or INT8, calibration, batches)
        checked_on = providers if profile in NEEDS_PROVIDER else CPU
        report["self_check"] = _checked(src, out, batches, profile, report["fusions"], checked_on)
        replace_file(out, dst)
    report["bytes"] = dst.stat().st_size
    report["seconds"] = round(time.perf_counter() - t0, 2)
    log.info(
        "optimize: %s → %s (%s; %.1f MB, self-check max |Δ| %.2g, %.1fs)",
        src.name,
        dst.name,
        ", ".join(f"{k} {v}" for k, v in report["fusions"].items()),
        report["bytes"] / 1e6,
        report["self_check"]["logits_max_abs_diff"],
        report["seconds"],
    )
    return report


def check_engine(src: Path, profile: str, *, cpu_flags: frozenset[str] | None = None) -> dict[str, Any]:
    """``profile`` (one of :data:`~seqcls.spec.ENGINES`) checked on ``src``, the fp32 graph it serves: the
    engine compiles it at the profile's precision on this CPU and runs the synthetic batches; returns the
    figures (max |Δlogit| vs ONNX Runtime fp32, rows whose decisions at 0.5 moved). Raises
    :class:`ConversionError` when the host cannot (no bf16 CPU, no OpenVINO) or the graph does not run."""
    import onnx

    src = Path(src)
    if profile not in ENGINES:
        raise ConversionError(f"optimize: profile {profile!r} has no engine; engines serve {', '.join(ENGINES)}")
    refusal = host_refusal(profile, providers=CPU, cpu_flags=cpu_flags)
    if refusal:
        raise ConversionError(refusal)
    t0 = time.perf_counter()
    batches = synthetic_batches(onnx.load(str(src), load_external_data=False))
    try:
        engine = seqcls_engine.session(src, profile)
        ref = session(src, threads=2)
        out = engine.get_outputs()[0].name
        pairs = [(ref.run([out], f)[0].astype(np.float64), engine.run([out], f)[0].astype(np.float64)) for f in batches]
    except Exception as exc:
        raise ConversionError(
            f"optimize: {src.name} does not run as profile {profile!r}: {type(exc).__name__}: {exc}"
        ) from exc
    name, precision = ENGINES[profile]
    report = {
        "profile": profile,
        "engine": name,
        "precision": engine.precision,
        "served_file": src.name,
        "self_check": {
            "logits_max_abs_diff": max(float(np.abs(a - b).max(initial=0.0)) for a, b in pairs),
            "rows_changed": sum(int(((a > 0) != (b > 0)).any(axis=1).sum()) for a, b in pairs),
            "rows": sum(a.shape[0] for a, _ in pairs),
        },
        # the engine's load-time check on this host: may texts of one bucket share a run (seqcls_engine)
        "batch_invariance": engine.self_check,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    log.info(
        "optimize: %s runs as %s on %s at %s (self-check max |Δlogit| %.2g, %d of %d rows' decisions moved, %.1fs)",
        src.name,
        profile,
        name,
        precision,
        report["self_check"]["logits_max_abs_diff"],
        report["self_check"]["rows_changed"],
        report["self_check"]["rows"],
        report["seconds"],
    )
    return report


def _check_request(src: Path, profile: str, providers: Sequence[str]) -> None:
    if profile not in PROFILES:
        raise ConversionError(f"optimize: unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")
    refusal = host_refusal(profile, providers=providers)
    if refusal:
        raise ConversionError(refusal)
    if not src.is_file() or src.stat().st_size == 0:
        raise ConversionError(f"optimize: {src} is missing or empty")


def _fuse(
    model, src_name: str, profile: str, inputs: Sequence[str], *, num_heads: int, hidden_size: int
) -> tuple[Any, dict[str, Any]]:
    """Pre-process and fuse ``model`` → (ORT optimizer holding the fused model, report so far)."""
    layers = sum(1 for n in model.graph.node if n.op_type == "Softmax")
    try:
        prep = prepare_for_fusion(model, num_heads=num_heads, hidden_size=hidden_size)
        optimizer, stats = fuse_bert(model, num_heads=num_heads, hidden_size=hidden_size)
    except ConversionError:
        raise
    except Exception as exc:
        raise ConversionError(f"optimize: BERT fusion of {src_name} failed: {type(exc).__name__}: {exc}") from exc
    check_contract(optimizer.model, "after fusion", inputs)
    raised = raise_opset_for_layernorm(optimizer.model)
    if raised is not None:
        log.info("optimize: opset %d → 17 for the LayerNormalization ops the fusion left", raised)
    attention = stats.get("Attention", 0)
    if attention < layers:
        log.warning(
            "optimize: Attention fused in %d of %d attention blocks (the rest stays unfused, still exact%s)",
            attention,
            layers,
            "; no ORT Attention pattern matches this graph, e.g. DeBERTa-v2's disentangled attention: only "
            "LayerNorm/SkipLayerNorm/Gelu fuse"
            if not attention
            else "",
        )
    report: dict[str, Any] = {
        "profile": profile,
        "fusions": stats,
        "preprocess": prep,
        "attention_blocks": layers,
        "attention_fused": attention,
        "fusion_opt_level": 0,
        "attention_mask_format": "raw 2-D",
    }
    if raised is not None:
        report["opset_raised"] = {"from": raised, "to": 17, "why": "LayerNormalization left unfused"}
    return optimizer, report


def _write_profile(
    optimizer,
    tmp: Path,
    profile: str,
    report: dict[str, Any],
    inputs: Sequence[str],
    recipe: Int8Recipe,
    calibration: Calibration | None,
    synthetic: list[dict[str, np.ndarray]],
) -> Path:
    """Save the fused model under ``tmp`` (checked ONNX), quantized for ``int8``; the file to serve."""
    import onnx

    fused_path = tmp / "fused.onnx"
    try:
        optimizer.save_model_to_file(str(fused_path))
        onnx.checker.check_model(str(fused_path), full_check=True)
    except Exception as exc:
        raise ConversionError(f"optimize: the fused model is not valid ONNX: {str(exc)[:300]}") from exc
    if profile == "fp16":
        return _to_fp16(optimizer, tmp, report)
    if profile != "int8":
        return fused_path
    out = tmp / "int8.onnx"
    report["quantization"] = quantize_checked(fused_path, out, inputs, recipe, calibration, synthetic)
    return out


def _to_fp16(optimizer, tmp: Path, report: dict[str, Any]) -> Path:
    """The fused model in fp16 at ``tmp/fp16.onnx``: the graph's inputs and ``logits`` stay fp32 (the
    serving contract), and so do the head's MatMuls/Gemms — a negligible share of the compute, and
    the logits' own precision decides the thresholded labels (as in int8)."""
    import onnx

    kept = head_nodes(optimizer.model)
    try:
        optimizer.convert_float_to_float16(keep_io_types=True, node_block_list=kept)
        out = tmp / "fp16.onnx"
        optimizer.save_model_to_file(str(out))
        onnx.checker.check_model(str(out), full_check=True)
    except Exception as exc:
        raise ConversionError(f"optimize: fp16 conversion failed: {type(exc).__name__}: {str(exc)[:300]}") from exc
    report["fp16"] = {"kept_fp32": kept, "io": "fp32 (keep_io_types)"}
    return out


def _checked(
    src: Path, out: Path, batches: list, profile: str, stats: dict[str, int], providers: Sequence[str] = CPU
) -> dict[str, float]:
    """Self-check ``out`` (on ``providers``) against ``src``; ``fp32-fused`` must stay within the exact tolerance."""
    try:
        check = self_check(src, out, batches, providers)
    except Exception as exc:
        raise ConversionError(f"optimize: the {profile} model does not run: {type(exc).__name__}: {exc}") from exc
    if profile == "fp32-fused" and check["tolerance_ratio"] > 1.0:
        raise ConversionError(
            f"optimize: fused model differs from {src.name} beyond the exact-parity tolerance on synthetic "
            f"batches (logits max |Δ| {check['logits_max_abs_diff']:.3g}, atol {SELF_CHECK_ATOL} + rtol "
            f"{SELF_CHECK_RTOL}); fusions {stats}"
        )
    return check
