"""Serving profiles beyond plain fp32: offline graph fusion (``fp32-fused``) and dynamic INT8 (``int8``).

``convert`` calls :func:`optimize_onnx` for every profile except ``fp32``; the result is
``onnx/served.onnx``, the file that is validated and served.

Why a pre-processing pass: ONNX Runtime's BERT fusions (``onnxruntime.transformers``) were
written against PyTorch/TF exports. On paddle2onnx's ERNIE graph they fuse the embeddings,
SkipLayerNormalization and BiasGelu but never ``Attention``, for two reasons found by reading
``fusion_attention.py`` against the graph:

1. **Where the scale sits.** Paddle scales the query *before* ``Q·Kᵀ`` with a ``scale`` op
   (``Mul(q, 1/√d)`` followed by ``Add(·, 0)``), while every pattern ORT knows puts the scale
   *after* it (``Div``/``Mul`` between ``MatMul`` and the mask ``Add``). We move it there as
   ``Div(Q·Kᵀ, √d)``: for head sizes that are powers of four (64 in ERNIE 3.0) ``1/√d`` is a
   power of two and both forms are bit-identical; otherwise they differ by float rounding. A
   ``Div`` rather than a ``Mul`` because ORT matches the mask ``Add``'s parent by op type only,
   and would pick the scale ``Mul`` instead of the mask ``Mul``.
2. **How the mask is built.** Paddle derives the additive mask from the ids,
   ``unsqueeze(cast(input_ids == pad) * -1e4 + 0, [1, 2])``; ORT expects the
   ``(1 - cast(unsqueeze(unsqueeze(mask)))) * -10000`` form over a 2-D keep-mask. We rebuild
   it in that form from ``not(input_ids == pad)`` — the same values (``-1e4`` on padding, 0
   elsewhere) — and ask for the *raw* 2-D mask format, so the fused ``Attention`` masks exactly
   the padded positions (the default "mask index" format assumes right padding only).

Identity nodes (paddle2onnx emits one per Paddle op output) are dropped first. After fusion a
self-check runs the source and the fused model on synthetic padded batches; ``fp32-fused`` must
stay within the exact-parity tolerance (|Δ| ≤ 1e-4 + 1e-3·|x|, the gate's defaults) or the
conversion fails here with the figures. ``int8`` quantizes the fused model dynamically
(``quantize_dynamic``, QInt8 weights, per-tensor, activations quantized at run time); its
numbers are reported and the validate step gates it on decision agreement instead.

Fusion runs with ``opt_level=0`` (Python fusions only): ONNX Runtime's own offline pass
(``opt_level`` ≥ 1) needs PyTorch in ``onnxruntime.transformers``, and the served file should
stay portable anyway — the serving session applies ORT's graph optimisations at load time.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.errors import ConversionError

log = logging.getLogger(__name__)

PROFILES = ("fp32-fused", "int8")
INPUT_NAMES = ("input_ids", "token_type_ids")
OUTPUT_NAME = "logits"
#: Self-check tolerance for ``fp32-fused`` — the parity gate's defaults (ReleaseConfig atol/rtol).
SELF_CHECK_ATOL = 1e-4
SELF_CHECK_RTOL = 1e-3


# ----------------------------------------------------------------------------- graph helpers


def _consumers(graph) -> dict[str, list]:
    out: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out


def _producers(graph) -> dict[str, Any]:
    return {name: node for node in graph.node for name in node.output}


def _constants(graph) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _scalar(consts: dict[str, np.ndarray], name: str) -> float | None:
    value = consts.get(name)
    if value is None or value.size != 1:
        return None
    return float(value.ravel()[0])


def _unique(graph, base: str) -> str:
    taken = {n for node in graph.node for n in (*node.input, *node.output)} | {t.name for t in graph.initializer}
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


def _add_initializer(graph, name: str, value: np.ndarray) -> str:
    from onnx import numpy_helper

    name = _unique(graph, name)
    graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def _toposort(graph) -> None:
    """Re-order nodes topologically (rewrites insert nodes wherever convenient)."""
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(graph.node)
    ordered = []
    while pending:
        rest = []
        for node in pending:
            if all(name in available for name in node.input):
                ordered.append(node)
                available.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            missing = sorted({n for node in rest for n in node.input if n not in available})[:5]
            raise ConversionError(f"optimize: graph has a cycle or undefined inputs after rewriting ({missing})")
        pending = rest
    del graph.node[:]
    graph.node.extend(ordered)


# ----------------------------------------------------------------------------- pre-processing


def strip_identities(model) -> int:
    """Bypass Identity nodes (not those producing a graph output); returns how many went."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    alias: dict[str, str] = {}
    keep = []
    for node in graph.node:
        if node.op_type == "Identity" and node.output[0] not in outputs:
            alias[node.output[0]] = node.input[0]
        else:
            keep.append(node)

    def resolve(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    for node in keep:
        for i, name in enumerate(node.input):
            node.input[i] = resolve(name)
    del graph.node[:]
    graph.node.extend(keep)
    return len(alias)


def move_query_scale(model, head_size: int) -> int:
    """``Softmax(Mul(q, s) [+ 0] · Kᵀ + mask)`` → ``Softmax(Div(q · Kᵀ, 1/s) + mask)``.

    Only where ``s`` is ``1/√head_size`` (the scale ORT's fused Attention applies); returns the
    number of attention blocks rewritten.
    """
    from onnx import helper

    graph = model.graph
    consts = _constants(graph)
    cons, prod = _consumers(graph), _producers(graph)
    expected = head_size**-0.5
    moved, dead = 0, []
    for softmax in [n for n in graph.node if n.op_type == "Softmax"]:
        add_mask = prod.get(softmax.input[0])
        if add_mask is None or add_mask.op_type != "Add" or len(add_mask.input) != 2:
            continue
        qk = [(k, prod.get(x)) for k, x in enumerate(add_mask.input)]
        qk = [(k, p) for k, p in qk if p is not None and p.op_type == "MatMul"]
        if len(qk) != 1:
            continue
        k_index, matmul = qk[0]
        mask_input = add_mask.input[1 - k_index]
        chain = []
        q = prod.get(matmul.input[0])
        if q is not None and q.op_type == "Add":  # paddle's scale op: x * s + 0
            zero = [i for i, x in enumerate(q.input) if _scalar(consts, x) == 0.0]
            if len(zero) != 1:
                continue
            chain.append(q)
            q = prod.get(q.input[1 - zero[0]])
        if q is None or q.op_type != "Mul":
            continue
        scales = [(i, _scalar(consts, x)) for i, x in enumerate(q.input)]
        scales = [(i, s) for i, s in scales if s is not None]
        if len(scales) != 1:
            continue
        s_index, scale = scales[0]
        if not np.isclose(scale, expected, rtol=1e-6, atol=0.0):
            log.info("optimize: attention scale %.6g is not 1/sqrt(%d) — block left unfused", scale, head_size)
            continue
        chain.append(q)
        if any(len(cons.get(n.output[0], [])) != 1 for n in chain):
            continue
        matmul.input[0] = q.input[1 - s_index]
        divisor = _add_initializer(graph, f"{matmul.output[0]}_sqrt_d", np.array(1.0 / scale, dtype=np.float32))
        scaled = _unique(graph, f"{matmul.output[0]}_scaled")
        graph.node.append(helper.make_node("Div", [matmul.output[0], divisor], [scaled], name=scaled))
        add_mask.input[0], add_mask.input[1] = scaled, mask_input
        dead.extend(chain)
        moved += 1
    for node in dead:
        graph.node.remove(node)
    if moved:
        _toposort(graph)
    return moved


def _unsqueeze_axes(node, consts: dict[str, np.ndarray]) -> list[int] | None:
    if len(node.input) > 1:
        axes = consts.get(node.input[1])
        return None if axes is None else sorted(int(a) for a in axes.ravel())
    for attr in node.attribute:
        if attr.name == "axes":
            return sorted(int(a) for a in attr.ints)
    return None


def rewrite_padding_mask(model) -> int:
    """Paddle's ``unsqueeze(cast(ids == pad) * neg [+ 0], [1, 2])`` → ORT's
    ``(1 - cast(unsqueeze(unsqueeze(keep)))) * neg`` with ``keep = not(ids == pad)``."""
    from onnx import TensorProto, helper

    graph = model.graph
    inputs = {i.name for i in graph.input}
    consts = _constants(graph)
    cons = _consumers(graph)
    rewritten = 0
    for equal in [n for n in graph.node if n.op_type == "Equal"]:
        if not any(x in inputs for x in equal.input):
            continue
        nxt = cons.get(equal.output[0], [])
        if len(nxt) != 1 or nxt[0].op_type != "Cast":
            continue
        cast = nxt[0]
        nxt = cons.get(cast.output[0], [])
        if len(nxt) != 1 or nxt[0].op_type != "Mul":
            continue
        mul = nxt[0]
        neg = [_scalar(consts, x) for x in mul.input if x != cast.output[0]]
        if len(neg) != 1 or neg[0] is None or neg[0] >= 0:
            continue
        chain = [cast, mul]
        nxt = cons.get(mul.output[0], [])
        if len(nxt) == 1 and nxt[0].op_type == "Add":
            zero = [_scalar(consts, x) for x in nxt[0].input if x != mul.output[0]]
            if zero == [0.0]:
                chain.append(nxt[0])
                nxt = cons.get(nxt[0].output[0], [])
        if len(nxt) != 1 or nxt[0].op_type != "Unsqueeze" or _unsqueeze_axes(nxt[0], consts) != [1, 2]:
            continue
        unsqueeze = nxt[0]
        chain.append(unsqueeze)
        if any(len(cons.get(n.output[0], [])) != 1 for n in chain[:-1]):
            continue
        base = equal.output[0]
        keep = _unique(graph, f"{base}_keep")
        keep64 = _unique(graph, f"{base}_keep_int64")
        ax1 = _add_initializer(graph, f"{base}_axis1", np.array([1], dtype=np.int64))
        ax2 = _add_initializer(graph, f"{base}_axis2", np.array([2], dtype=np.int64))
        one = _add_initializer(graph, f"{base}_one", np.array(1.0, dtype=np.float32))
        neg_value = _add_initializer(graph, f"{base}_mask_value", np.array(neg[0], dtype=np.float32))
        u1, u2, u2f, inv = (_unique(graph, f"{base}_{s}") for s in ("u1", "u2", "u2f", "inv"))
        graph.node.extend(
            [
                helper.make_node("Not", [base], [keep], name=keep),
                helper.make_node("Cast", [keep], [keep64], name=keep64, to=TensorProto.INT64),
                helper.make_node("Unsqueeze", [keep64, ax1], [u1], name=u1),
                helper.make_node("Unsqueeze", [u1, ax2], [u2], name=u2),
                helper.make_node("Cast", [u2], [u2f], name=u2f, to=TensorProto.FLOAT),
                helper.make_node("Sub", [one, u2f], [inv], name=inv),
                helper.make_node("Mul", [inv, neg_value], [unsqueeze.output[0]], name=f"{base}_mask"),
            ]
        )
        for node in chain:
            graph.node.remove(node)
        rewritten += 1
    if rewritten:
        _toposort(graph)
    return rewritten


def prepare_for_fusion(model, *, num_heads: int, hidden_size: int) -> dict[str, int]:
    """Rewrite a paddle2onnx ERNIE/BERT graph in place so ORT's Attention fusion matches it."""
    if hidden_size % num_heads:
        raise ConversionError(f"optimize: hidden_size {hidden_size} is not a multiple of num_heads {num_heads}")
    removed = strip_identities(model)
    masks = rewrite_padding_mask(model)
    scales = move_query_scale(model, hidden_size // num_heads)
    return {"identities_removed": removed, "masks_rewritten": masks, "query_scales_moved": scales}


# ----------------------------------------------------------------------------- fusion / INT8


def fuse_bert(model, *, num_heads: int, hidden_size: int):
    """ORT's BERT fusions (Python only, CPU target, raw 2-D attention mask) → (optimizer, stats).

    Save with ``optimizer.save_model_to_file`` (it adds the ``com.microsoft`` opset import).
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.use_raw_attention_mask(True)
    optimizer = optimize_model(
        model,
        model_type="bert",
        num_heads=num_heads,
        hidden_size=hidden_size,
        opt_level=0,
        use_gpu=False,
        optimization_options=options,
    )
    stats = {k: int(v) for k, v in optimizer.get_fused_operator_statistics().items() if v}
    return optimizer, stats


def _check_contract(model, where: str) -> None:
    from onnx import TensorProto

    inputs = {i.name: i.type.tensor_type for i in model.graph.input}
    problems = []
    for name in INPUT_NAMES:
        t = inputs.get(name)
        if t is None:
            problems.append(f"input {name!r} missing")
        elif t.elem_type != TensorProto.INT64 or len(t.shape.dim) != 2:
            problems.append(f"input {name!r} is no longer int64 [batch, seq]")
    outputs = [o.name for o in model.graph.output]
    if outputs != [OUTPUT_NAME]:
        problems.append(f"outputs {outputs}, expected [{OUTPUT_NAME!r}]")
    if problems:
        raise ConversionError(f"optimize ({where}): " + "; ".join(problems))


def _synthetic_batches(model, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Padded id batches within the model's vocabulary (right padding with the model's pad id)."""
    graph = model.graph
    consts = _constants(graph)
    vocab, pad = 100, 0
    for node in graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == "input_ids":
            table = consts.get(node.input[0])
            if table is not None and table.ndim == 2:
                vocab = int(table.shape[0])
        if node.op_type == "Equal" and "input_ids" in node.input:
            other = [_scalar(consts, x) for x in node.input if x != "input_ids"]
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

    ref, got = session(reference), session(candidate)
    worst_abs, worst_ratio = 0.0, 0.0
    for feeds in batches:
        a = ref.run([OUTPUT_NAME], feeds)[0]
        b = got.run([OUTPUT_NAME], feeds)[0]
        diff = np.abs(a.astype(np.float64) - b)
        worst_abs = max(worst_abs, float(diff.max(initial=0.0)))
        worst_ratio = max(worst_ratio, float((diff / (SELF_CHECK_ATOL + SELF_CHECK_RTOL * np.abs(a))).max(initial=0.0)))
    return {"logits_max_abs_diff": worst_abs, "tolerance_ratio": worst_ratio}


def head_nodes(model) -> list[str]:
    """Names of the MatMuls after the encoder (pooler, classifier): walk back from the output to
    the last (Skip)LayerNormalization. Kept in fp32 — a negligible share of the compute, and the
    logits' own precision decides the thresholded labels."""
    prod = _producers(model.graph)
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

    if profile not in PROFILES:
        raise ConversionError(f"optimize: unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")
    src, dst = Path(src), Path(dst)
    if not src.is_file() or src.stat().st_size == 0:
        raise ConversionError(f"optimize: {src} is missing or empty")
    t0 = time.perf_counter()
    model = onnx.load(str(src))
    batches = _synthetic_batches(model)
    layers = sum(1 for n in model.graph.node if n.op_type == "Softmax")
    try:
        prep = prepare_for_fusion(model, num_heads=num_heads, hidden_size=hidden_size)
        optimizer, stats = fuse_bert(model, num_heads=num_heads, hidden_size=hidden_size)
    except ConversionError:
        raise
    except Exception as exc:
        raise ConversionError(f"optimize: BERT fusion of {src.name} failed: {type(exc).__name__}: {exc}") from exc
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
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=".optimize-") as tmp:
        fused_path = Path(tmp) / "fused.onnx"
        try:
            optimizer.save_model_to_file(str(fused_path))
            onnx.checker.check_model(str(fused_path), full_check=True)
        except Exception as exc:
            raise ConversionError(f"optimize: the fused model is not valid ONNX: {str(exc)[:300]}") from exc
        out = fused_path
        if profile == "int8":
            out = Path(tmp) / "int8.onnx"
            try:
                report["quantization"] = quantize_int8(fused_path, out)
            except Exception as exc:
                raise ConversionError(f"optimize: INT8 quantization failed: {type(exc).__name__}: {exc}") from exc
            _check_contract(onnx.load(str(out), load_external_data=False), "after INT8 quantization")
        try:
            check = self_check(src, out, batches)
        except Exception as exc:
            raise ConversionError(f"optimize: the {profile} model does not run: {type(exc).__name__}: {exc}") from exc
        report["self_check"] = check
        if profile == "fp32-fused" and check["tolerance_ratio"] > 1.0:
            raise ConversionError(
                f"optimize: fused model differs from {src.name} beyond the exact-parity tolerance on synthetic "
                f"batches (logits max |Δ| {check['logits_max_abs_diff']:.3g}, atol {SELF_CHECK_ATOL} + rtol "
                f"{SELF_CHECK_RTOL}); fusions {stats}"
            )
        os.replace(out, dst)
    report["bytes"] = dst.stat().st_size
    report["seconds"] = round(time.perf_counter() - t0, 2)
    log.info(
        "optimize: %s → %s (%s; %.1f MB, self-check max |Δ| %.2g, %.1fs)",
        src.name,
        dst.name,
        ", ".join(f"{k} {v}" for k, v in stats.items()),
        report["bytes"] / 1e6,
        report["self_check"]["logits_max_abs_diff"],
        report["seconds"],
    )
    return report
