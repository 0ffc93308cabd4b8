"""Serving profiles beyond plain fp32: offline graph fusion (``fp32-fused``) and dynamic INT8 (``int8``).

``convert`` calls :func:`optimize_onnx` for every profile except ``fp32``; the result is
``onnx/served.onnx``, the file that is validated and served. The graph rewrites and ORT's BERT
fusions live in :mod:`seqcls.fusion` (why paddle2onnx's graph needs them is explained there).

After fusion a self-check runs the source and the fused model on synthetic padded batches;
``fp32-fused`` must stay within the exact-parity tolerance (|Δ| ≤ atol + rtol·|x|, the gate's
defaults in :class:`~seqcls.config.ReleaseConfig`) or the conversion fails here with the
figures. ``int8`` quantizes the fused model dynamically (``quantize_dynamic``, QInt8 weights
per output channel, activations quantized at run time, the classification head left in fp32);
its numbers are reported and the validate step gates it on decision agreement instead.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.config import ReleaseConfig
from seqcls.errors import ConversionError
from seqcls.fusion import constants, fuse_bert, prepare_for_fusion, producers, scalar
from seqcls.serving import shipped

log = logging.getLogger(__name__)

PROFILES = ("fp32-fused", "int8")
#: Self-check tolerance for ``fp32-fused`` — the parity gate's defaults.
SELF_CHECK_ATOL: float = ReleaseConfig.atol
SELF_CHECK_RTOL: float = ReleaseConfig.rtol


def _io_names() -> tuple[tuple[str, ...], str]:
    """The ONNX graph's input names and its output name, from the serving contract."""
    contract = shipped.contract()
    return tuple(contract.MODEL_INPUTS), contract.LOGITS_OUTPUT


def _check_contract(model, where: str) -> None:
    from onnx import TensorProto

    input_names, output_name = _io_names()
    inputs = {i.name: i.type.tensor_type for i in model.graph.input}
    problems = []
    for name in input_names:
        t = inputs.get(name)
        if t is None:
            problems.append(f"input {name!r} missing")
        elif t.elem_type != TensorProto.INT64 or len(t.shape.dim) != 2:
            problems.append(f"input {name!r} is no longer int64 [batch, seq]")
    outputs = [o.name for o in model.graph.output]
    if outputs != [output_name]:
        problems.append(f"outputs {outputs}, expected [{output_name!r}]")
    if problems:
        raise ConversionError(f"optimize ({where}): " + "; ".join(problems))


def _synthetic_batches(model, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Padded id batches within the model's vocabulary (right padding with the model's pad id)."""
    graph = model.graph
    consts = constants(graph)
    vocab, pad = 100, 0
    for node in graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == "input_ids":
            table = consts.get(node.input[0])
            if table is not None and table.ndim == 2:
                vocab = int(table.shape[0])
        if node.op_type == "Equal" and "input_ids" in node.input:
            other = [scalar(consts, x) for x in node.input if x != "input_ids"]
            if other and other[0] is not None:
                pad = int(other[0])
    rng = np.random.default_rng(seed)
    batches = []
    for batch, seq in ((1, 9), (3, 24), (8, 64)):
        ids = rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)
        ids[ids == pad] = (pad + 1) % vocab
        for row in range(1, batch):  # row 0 full length; the others right-padded
            ids[row, int(rng.integers(2, seq)) :] = pad
        batches.append({"input_ids": ids, "token_type_ids": np.zeros_like(ids)})
    return batches


def self_check(reference: Path, candidate: Path, batches: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """Max |Δ| and the worst tolerance ratio (|Δ| / (atol + rtol·|ref|)) of ``candidate`` vs ``reference``."""
    import onnxruntime as ort

    def session(path: Path):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 3
        return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])

    output_name = _io_names()[1]
    ref, got = session(reference), session(candidate)
    worst_abs, worst_ratio = 0.0, 0.0
    for feeds in batches:
        a = ref.run([output_name], feeds)[0]
        b = got.run([output_name], feeds)[0]
        diff = np.abs(a.astype(np.float64) - b)
        worst_abs = max(worst_abs, float(diff.max(initial=0.0)))
        worst_ratio = max(worst_ratio, float((diff / (SELF_CHECK_ATOL + SELF_CHECK_RTOL * np.abs(a))).max(initial=0.0)))
    return {"logits_max_abs_diff": worst_abs, "tolerance_ratio": worst_ratio}


def head_nodes(model) -> list[str]:
    """Names of the MatMuls after the encoder (pooler, classifier): walk back from the output to
    the last (Skip)LayerNormalization. Kept in fp32 — a negligible share of the compute, and the
    logits' own precision decides the thresholded labels."""
    prod = producers(model.graph)
    stop = {"SkipLayerNormalization", "LayerNormalization", "Attention", "EmbedLayerNormalization"}
    seen: set[str] = set()
    names = []
    stack = [o.name for o in model.graph.output]
    while stack:
        node = prod.get(stack.pop())
        if node is None or id(node) in seen or node.op_type in stop:
            continue
        seen.add(id(node))
        if node.op_type == "MatMul":
            names.append(node.name)
        stack.extend(node.input)
    return names


def quantize_int8(src: Path, dst: Path) -> dict[str, Any]:
    """Dynamic INT8 of the encoder: QInt8 weights per output channel, uint8 activations quantized at
    run time, the classification head left in fp32 (measured on the ERNIE-3.0-medium shape: same
    speed as quantizing everything, fewer changed decisions)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(src), load_external_data=False)
    exclude = head_nodes(model)
    if any(not name for name in exclude):
        exclude = []  # unnamed nodes cannot be excluded by name: quantize everything
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # the quantizer logs one root INFO line per tensor
    try:
        quantize_dynamic(
            str(src),
            str(dst),
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=False,
            nodes_to_exclude=exclude,
        )
    finally:
        root.setLevel(level)
    return {
        "method": "quantize_dynamic",
        "weight_type": "QInt8",
        "per_channel": True,
        "reduce_range": False,
        "fp32_nodes": exclude,
    }


def optimize_onnx(src: Path, dst: Path, profile: str, *, num_heads: int, hidden_size: int) -> dict:
    """Write the ``profile``'s served model for ``src`` to ``dst``; returns what was done.

    ``fp32-fused``: pre-processing + ORT BERT fusions; ``int8``: the same, then dynamic INT8.
    Raises :class:`ConversionError` when a step fails, the I/O contract changed, or (fp32-fused)
    the fused model left the exact-parity tolerance on the self-check batches.
    """
    import onnx

    src, dst = Path(src), Path(dst)
    _check_request(src, profile)
    t0 = time.perf_counter()
    model = onnx.load(str(src))
    batches = _synthetic_batches(model)
    optimizer, report = _fuse(model, src.name, profile, num_heads=num_heads, hidden_size=hidden_size)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=".optimize-") as tmp:
        out = _write_profile(optimizer, Path(tmp), profile, report)
        report["self_check"] = _checked(src, out, batches, profile, report["fusions"])
        os.replace(out, dst)
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


def _check_request(src: Path, profile: str) -> None:
    if profile not in PROFILES:
        raise ConversionError(f"optimize: unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")
    if not src.is_file() or src.stat().st_size == 0:
        raise ConversionError(f"optimize: {src} is missing or empty")


def _fuse(model, src_name: str, profile: str, *, num_heads: int, hidden_size: int) -> tuple[Any, dict[str, Any]]:
    """Pre-process and fuse ``model`` → (ORT optimizer holding the fused model, report so far)."""
    layers = sum(1 for n in model.graph.node if n.op_type == "Softmax")
    try:
        prep = prepare_for_fusion(model, num_heads=num_heads, hidden_size=hidden_size)
        optimizer, stats = fuse_bert(model, num_heads=num_heads, hidden_size=hidden_size)
    except ConversionError:
        raise
    except Exception as exc:
        raise ConversionError(f"optimize: BERT fusion of {src_name} failed: {type(exc).__name__}: {exc}") from exc
    _check_contract(optimizer.model, "after fusion")
    attention = stats.get("Attention", 0)
    if attention < layers:
        log.warning(
            "optimize: Attention fused in %d of %d attention blocks (the rest stays unfused, still exact)",
            attention,
            layers,
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
    return optimizer, report


def _write_profile(optimizer, tmp: Path, profile: str, report: dict[str, Any]) -> Path:
    """Save the fused model under ``tmp`` (checked ONNX), quantized for ``int8``; the file to serve."""
    import onnx

    fused_path = tmp / "fused.onnx"
    try:
        optimizer.save_model_to_file(str(fused_path))
        onnx.checker.check_model(str(fused_path), full_check=True)
    except Exception as exc:
        raise ConversionError(f"optimize: the fused model is not valid ONNX: {str(exc)[:300]}") from exc
    if profile != "int8":
        return fused_path
    out = tmp / "int8.onnx"
    try:
        report["quantization"] = quantize_int8(fused_path, out)
    except Exception as exc:
        raise ConversionError(f"optimize: INT8 quantization failed: {type(exc).__name__}: {exc}") from exc
    _check_contract(onnx.load(str(out), load_external_data=False), "after INT8 quantization")
    return out


def _checked(src: Path, out: Path, batches: list, profile: str, stats: dict[str, int]) -> dict[str, float]:
    """Self-check ``out`` against ``src``; ``fp32-fused`` must stay within the exact tolerance."""
    try:
        check = self_check(src, out, batches)
    except Exception as exc:
        raise ConversionError(f"optimize: the {profile} model does not run: {type(exc).__name__}: {exc}") from exc
    if profile == "fp32-fused" and check["tolerance_ratio"] > 1.0:
        raise ConversionError(
            f"optimize: fused model differs from {src.name} beyond the exact-parity tolerance on synthetic "
            f"batches (logits max |Δ| {check['logits_max_abs_diff']:.3g}, atol {SELF_CHECK_ATOL} + rtol "
            f"{SELF_CHECK_RTOL}); fusions {stats}"
        )
    return check
