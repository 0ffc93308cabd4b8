"""The ``int8`` profile: INT8 recipes, quantization with ONNX Runtime, and the checked ladder.

:func:`quantize_checked` quantizes the fused model with the recipe :data:`INT8` (see there: which
ops, which stay fp32) and then measures it on the release's golden texts (``convert`` passes
them as a :class:`~seqcls.profiles.calibration.Calibration`, tokenized by the serving tokenizer; static
recipes also take their activation ranges from them): when its label decisions agree with the
fused fp32 model less than the gate's ``min_decision_agreement`` + :data:`INT8_MARGIN`, the next
recipe of :data:`INT8_FALLBACKS` (more layers in fp32) replaces it. Every attempt is reported;
the validate step gates the result on decision agreement. The recipes were chosen by a one-off
study of the candidates side by side (agreement, changed label sets, speed vs fp32; docs/performance.md).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.config import ReleaseConfig
from seqcls.errors import ConversionError
from seqcls.profiles.calibration import Calibration, CalibrationReader, calibration_feeds
from seqcls.profiles.checks import check_contract, decision_agreement, reference_logits
from seqcls.profiles.fusion import toposort
from seqcls.profiles.node_roles import node_roles

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- INT8 recipes


@dataclass(frozen=True)
class Int8Recipe:
    """How ``int8`` quantizes the fused model.

    ``method``: ``dynamic`` (``quantize_dynamic``: weights QInt8, activations quantized at run
    time per tensor and batch), ``static-qdq`` / ``static-qoperator`` (``quantize_static``:
    activation ranges fixed by calibration), ``weight-only`` (``MatMulNBits`` 8-bit blockwise
    weights; activations quantized per block of ``block_size`` at run time, accuracy level 4).
    ``op_types``: what is quantized; ``fp32``: roles of :func:`node_roles` kept in fp32.
    """

    name: str
    method: str = "dynamic"
    op_types: tuple[str, ...] = ("MatMul", "Attention")
    fp32: tuple[str, ...] = ("head",)
    per_channel: bool = True
    calibrate: str = "minmax"  # static: minmax | percentile | entropy
    percentile: float = 99.999
    block_size: int = 32  # weight-only
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def calibrated(self) -> bool:
        return self.method.startswith("static")


#: The ``int8`` profile: dynamic INT8 of the encoder's MatMuls and fused Attention (QInt8 weights
#: per output channel, activations quantized at run time); the embeddings (EmbedLayerNormalization)
#: and the classification head stay fp32. Measured by a one-off study on the bench's
#: ERNIE-3.0-medium-shaped model, seeds 0/1/2, gate figures on the 64 golden texts: agreement
#: 0.9979 / 0.9987 / 0.9975 (7 / 6 / 9 label sets changed) where the recipe before issue 16
#: (``op_types=()``: everything ORT quantizes dynamically, the embedding tables too) had
#: 0.9956 / 0.9981 / 0.9943 (13 / 9 / 20) — at the same speed, ≈3.1-3.7x fp32 in-process. Static
#: calibration on the golden texts (QDQ or QOperator, MinMax) was less exact (seed 2: 0.9928 /
#: 0.9932, below the gate) and slower (≈2x fp32).
INT8 = Int8Recipe("dynamic", op_types=("MatMul", "Attention"), fp32=("head",))
#: Tried in order when a recipe's decisions on the calibration texts (vs the fused fp32 model,
#: batched as validate batches them and each text alone) agree less than the gate's minimum +
#: :data:`INT8_MARGIN`: the feed-forward output MatMuls (inputs after GELU: the widest activation
#: range) kept fp32 — the most exact recipe measured (0.9985-0.9987 on all three seeds), ≈1.9x fp32.
INT8_FALLBACKS: tuple[Int8Recipe, ...] = (
    Int8Recipe("dynamic-ffn_out-fp32", op_types=("MatMul", "Attention"), fp32=("head", "ffn_out")),
)
#: The margin ``int8`` keeps above the gate's ``min_decision_agreement`` on the calibration texts.
#: This check has no hierarchy closure and also counts single-text runs, so it reads a little
#: higher than the gate (bench seed 2: 0.9983 here, 0.9975 at the gate); the margin covers that.
INT8_MARGIN = 0.002


def quantize_int8(
    src: Path, dst: Path, recipe: Int8Recipe = INT8, calibration: list[dict[str, np.ndarray]] | None = None
) -> dict[str, Any]:
    """Quantize the fused model ``src`` → ``dst`` with ``recipe``; returns what was done.

    ``calibration``: feeds for the static recipes' activation ranges (required by them).
    """
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    roles = node_roles(model)
    exclude = sorted({name for role in recipe.fp32 for name in roles.get(role, [])})
    if any(not name for name in exclude):
        raise ConversionError("optimize: unnamed nodes cannot be kept in fp32 by name")
    op_types = list(recipe.op_types) or None
    t0 = time.perf_counter()
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # the quantizer logs one root INFO line per tensor
    try:
        if recipe.method == "dynamic":
            # ORT's dynamic quantizer first replaces each Gemm (HF heads are Gemm) by a MatMul named
            # ``<gemm>_MatMul`` + Add: a Gemm kept fp32 must be excluded under that name as well
            gemms = {n.name for n in model.graph.node if n.op_type == "Gemm"}
            _dynamic(src, dst, recipe, op_types, [*exclude, *(f"{n}_MatMul" for n in exclude if n in gemms)])
        elif recipe.calibrated:
            if not calibration:
                raise ConversionError(f"optimize: INT8 recipe {recipe.name!r} needs calibration feeds")
            _static(src, dst, recipe, op_types, exclude, calibration)
        elif recipe.method == "weight-only":
            _weight_only(model, dst, recipe, exclude)
        else:
            raise ConversionError(f"optimize: unknown INT8 method {recipe.method!r}")
    finally:
        root.setLevel(level)
    resorted = _resort(dst)
    report = {k: v for k, v in asdict(recipe).items() if k != "extra" or v}
    report.update({"fp32_nodes": exclude, "quantize_seconds": round(time.perf_counter() - t0, 2)})
    if resorted:
        report["resorted"] = "nodes re-sorted: the quantizer's order ignored what If/Loop subgraphs read"
    return report


def _resort(path: Path) -> bool:
    """Re-sort the quantized model's nodes when the quantizer left one before a value its
    subgraphs read (PyTorch exports a dynamic ``squeeze`` as an ``If``; DeBERTa-v2 has them)."""
    import onnx

    model = onnx.load(str(path))
    if not toposort(model.graph):
        return False
    onnx.save(model, str(path))
    return True


def _extra(recipe: Int8Recipe) -> dict[str, Any]:
    """The quantizer's extra options: ``DefaultTensorType`` float — ONNX shape inference types no
    output of the fused ``com.microsoft`` ops (Attention, SkipLayerNormalization, ...), and a graph
    without ``value_info`` (PyTorch's export) leaves the MatMuls after them untyped, which the
    quantizer refuses; every activation a MatMul/Attention reads here is float. The recipe's own
    ``extra`` wins."""
    from onnx import TensorProto

    return {"DefaultTensorType": TensorProto.FLOAT, **recipe.extra}


def _dynamic(src: Path, dst: Path, recipe: Int8Recipe, op_types, exclude) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(src),
        str(dst),
        op_types_to_quantize=op_types,
        weight_type=QuantType.QInt8,
        per_channel=recipe.per_channel,
        reduce_range=False,
        nodes_to_exclude=exclude,
        extra_options=_extra(recipe),
    )


def _static(src: Path, dst: Path, recipe: Int8Recipe, op_types, exclude, calibration) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    methods = {
        "minmax": CalibrationMethod.MinMax,
        "percentile": CalibrationMethod.Percentile,
        "entropy": CalibrationMethod.Entropy,
    }
    extra = {"CalibMovingAverage": False, **_extra(recipe)}
    if recipe.calibrate == "percentile":
        extra.setdefault("CalibPercentile", recipe.percentile)
    with tempfile.TemporaryDirectory(prefix="seqcls-calib-") as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)  # the calibrator writes its augmented model into the working directory
        try:
            quantize_static(
                str(src),
                str(dst),
                CalibrationReader(calibration),
                quant_format=QuantFormat.QDQ if recipe.method == "static-qdq" else QuantFormat.QOperator,
                op_types_to_quantize=op_types,
                per_channel=recipe.per_channel,
                reduce_range=False,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=exclude,
                calibrate_method=methods[recipe.calibrate],
                extra_options=extra,
            )
        finally:
            os.chdir(cwd)


def _weight_only(model, dst: Path, recipe: Int8Recipe, exclude) -> None:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quant = MatMulNBitsQuantizer(
        model,
        bits=8,
        block_size=recipe.block_size,
        is_symmetric=True,
        accuracy_level=4,
        nodes_to_exclude=exclude,
        op_types_to_quantize=("MatMul",),
    )
    quant.process()
    onnx.save(quant.model.model, str(dst))


# ----------------------------------------------------------------------------- the checked ladder


def quantize_checked(
    fused_path: Path,
    out: Path,
    inputs: Sequence[str],
    recipe: Int8Recipe,
    calibration: Calibration | None,
    synthetic: list[dict[str, np.ndarray]],
) -> dict[str, Any]:
    """Quantize ``fused_path`` → ``out`` with ``recipe``, then each of :data:`INT8_FALLBACKS` in
    turn while the decisions on the calibration texts (``synthetic`` without them) agree with
    the fused model less than the gate's minimum + :data:`INT8_MARGIN`; returns the report."""
    import onnx

    t0 = time.perf_counter()
    feeds, cal = calibration_feeds(calibration, inputs, synthetic, recipe.name)
    target = (calibration.min_agreement if calibration else ReleaseConfig.min_decision_agreement) + INT8_MARGIN
    threshold = calibration.threshold if calibration else 0.5
    ladder = [recipe, *(r for r in INT8_FALLBACKS if r != recipe)]
    attempts = []
    try:  # the fused graph's answers, once for every recipe tried
        expected = reference_logits(fused_path, feeds)
    except Exception as exc:
        raise ConversionError(f"optimize: the fused model does not run: {type(exc).__name__}: {exc}") from exc
    for step in ladder:
        try:
            q = quantize_int8(fused_path, out, step, feeds if step.calibrated else None)
        except ConversionError:
            raise
        except Exception as exc:
            raise ConversionError(f"optimize: INT8 quantization failed: {type(exc).__name__}: {exc}") from exc
        check_contract(onnx.load(str(out), load_external_data=False), "after INT8 quantization", inputs)
        try:
            q["agreement"] = decision_agreement(expected, out, feeds, threshold)
        except Exception as exc:
            raise ConversionError(f"optimize: the int8 model does not run: {type(exc).__name__}: {exc}") from exc
        attempts.append({"recipe": step.name, **q["agreement"]})
        if q["agreement"]["agreement"] >= target:
            break
        log.warning(
            "optimize: INT8 %s agrees %.4f with fp32 on the %s (target %.4f = gate minimum + margin)%s",
            step.name,
            q["agreement"]["agreement"],
            cal["source"],
            target,
            "; trying the next recipe" if step is not ladder[-1] else "; no recipe left: the gate decides",
        )
    cal["seconds"] = round(time.perf_counter() - t0, 2)
    q.update({"calibration": cal, "target_agreement": round(target, 6), "attempts": attempts})
    _log_outcome(q, cal, target)
    return q


def _log_outcome(q: dict[str, Any], cal: dict[str, Any], target: float) -> None:
    log.info(
        "optimize: INT8 %s (%s of %s; %d node(s) kept fp32: %s) — decisions on %d %s (%s) agree %.4f with fp32 "
        "(target %.4f), max |Δp| %.3g; %d recipe(s) tried, %.1fs",
        q["name"],
        q["method"],
        ", ".join(q["op_types"]) or "every op ORT quantizes",
        len(q["fp32_nodes"]),
        ", ".join(q["fp32"]) or "none",
        cal["texts"],
        "texts" if cal["texts"] else "synthetic batches",
        cal["source"],
        q["agreement"]["agreement"],
        target,
        q["agreement"]["prob_max_abs_diff"],
        len(q["attempts"]),
        cal["seconds"],
    )
