"""Graph rewrites that let ONNX Runtime's BERT fusions match paddle2onnx's ERNIE graph.

ONNX Runtime's BERT fusions (``onnxruntime.transformers``) were written against PyTorch/TF
exports. On paddle2onnx's ERNIE graph they fuse the embeddings, SkipLayerNormalization and
BiasGelu but never ``Attention``, for two reasons found by reading ``fusion_attention.py``
against the graph:

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

Identity nodes (paddle2onnx emits one per Paddle op output) are dropped first. Fusion runs with
``opt_level=0`` (Python fusions only): ONNX Runtime's own offline pass (``opt_level`` ≥ 1)
needs PyTorch in ``onnxruntime.transformers``, and the served file should stay portable anyway —
the serving session applies ORT's graph optimisations at load time.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from seqcls.errors import ConversionError

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- graph helpers


def consumers(graph) -> dict[str, list]:
    out: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out


def producers(graph) -> dict[str, Any]:
    return {name: node for node in graph.node for name in node.output}


def constants(graph) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def scalar(consts: dict[str, np.ndarray], name: str) -> float | None:
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


def outer_scope_inputs(node) -> set[str]:
    """The names ``node``'s subgraphs (``If`` branches, ``Loop``/``Scan`` bodies) read from the
    enclosing graph: a dependency as real as an input, though not listed among ``node.input``."""
    from onnx import AttributeProto

    names: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            local = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
            local.update(name for n in g.node for name in n.output)
            used = [x for n in g.node for x in (*n.input, *outer_scope_inputs(n))] + [o.name for o in g.output]
            names.update(x for x in used if x not in local)
    return names


def toposort(graph) -> bool:
    """Re-order nodes topologically (rewrites insert nodes wherever convenient; ORT's quantizer
    sorts ignoring what subgraphs read from outside, which ``onnx.checker`` then rejects).
    Returns whether the order changed."""
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = [(i, node, [*node.input, *outer_scope_inputs(node)]) for i, node in enumerate(graph.node)]
    ordered = []
    while pending:
        rest = []
        for i, node, needs in pending:
            if all(name in available for name in needs):
                ordered.append((i, node))
                available.update(node.output)
            else:
                rest.append((i, node, needs))
        if len(rest) == len(pending):
            missing = sorted({n for *_, needs in rest for n in needs if n not in available})[:5]
            raise ConversionError(f"optimize: graph has a cycle or undefined inputs after rewriting ({missing})")
        pending = rest
    changed = [i for i, _ in ordered] != list(range(len(ordered)))
    if changed:
        nodes = [node for _, node in ordered]
        del graph.node[:]
        graph.node.extend(nodes)
    return changed


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
    consts = constants(graph)
    cons, prod = consumers(graph), producers(graph)
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
            zero = [i for i, x in enumerate(q.input) if scalar(consts, x) == 0.0]
            if len(zero) != 1:
                continue
            chain.append(q)
            q = prod.get(q.input[1 - zero[0]])
        if q is None or q.op_type != "Mul":
            continue
        scales = [(i, scalar(consts, x)) for i, x in enumerate(q.input)]
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
        toposort(graph)
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
    consts = constants(graph)
    cons = consumers(graph)
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
        neg = [scalar(consts, x) for x in mul.input if x != cast.output[0]]
        if len(neg) != 1 or neg[0] is None or neg[0] >= 0:
            continue
        chain = [cast, mul]
        nxt = cons.get(mul.output[0], [])
        if len(nxt) == 1 and nxt[0].op_type == "Add":
            zero = [scalar(consts, x) for x in nxt[0].input if x != mul.output[0]]
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
        toposort(graph)
    return rewritten


def prepare_for_fusion(model, *, num_heads: int, hidden_size: int) -> dict[str, int]:
    """Rewrite a paddle2onnx ERNIE/BERT graph in place so ORT's Attention fusion matches it."""
    if hidden_size % num_heads:
        raise ConversionError(f"optimize: hidden_size {hidden_size} is not a multiple of num_heads {num_heads}")
    removed = strip_identities(model)
    masks = rewrite_padding_mask(model)
    scales = move_query_scale(model, hidden_size // num_heads)
    return {"identities_removed": removed, "masks_rewritten": masks, "query_scales_moved": scales}


# ----------------------------------------------------------------------------- fusion


def _ort_transformers_on_path() -> None:
    """Put ``onnxruntime/transformers`` back on ``sys.path`` if it is gone: the package appends it once, at
    first import, and its modules import each other by top-level names (``fusion_options``), so a host that
    restored ``sys.path`` since (pytest's monkeypatch, an app sandboxing imports) broke the fusion."""
    import sys
    from pathlib import Path

    import onnxruntime.transformers as ort_transformers

    here = str(Path(ort_transformers.__file__).parent)
    if here not in sys.path:
        sys.path.append(here)


def fuse_bert(model, *, num_heads: int, hidden_size: int):
    """ORT's BERT fusions (Python only, CPU target, raw 2-D attention mask) → (optimizer, stats).

    Save with ``optimizer.save_model_to_file`` (it adds the ``com.microsoft`` opset import).
    """
    _ort_transformers_on_path()
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


def raise_opset_for_layernorm(model) -> int | None:
    """ORT's LayerNormalization fusion emits the ONNX-domain ``LayerNormalization`` (opset ≥ 17)
    whatever the graph's opset; where one is left unfused into EmbedLayerNormalization /
    SkipLayerNormalization in an opset < 17 graph (e.g. an embedding ORT's pattern does not
    match), ``onnx.checker`` rejects the model. Raise the default-domain opset to 17 then —
    none of the ops a BERT graph uses changed meaning between 14 and 17. Returns the old opset
    if it was raised."""
    if not any(n.op_type == "LayerNormalization" and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return None
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and imp.version < 17:
            old, imp.version = imp.version, 17
            return int(old)
    return None
