"""Node roles in a fused BERT-like graph: which MatMuls are the head, the embeddings, attention,
the feed-forward in/out — what an INT8 recipe keeps in fp32 by name."""

from __future__ import annotations

from seqcls.profiles.checks import graph_inputs
from seqcls.profiles.fusion import producers


def head_nodes(model) -> list[str]:
    """Names of the MatMuls and Gemms (PyTorch exports a Linear as Gemm) after the encoder
    (pooler, classifier): walk back from the output to the last (Skip)LayerNormalization. Kept
    in fp32 — a negligible share of the compute, and the logits' own precision decides the
    thresholded labels."""
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
        if node.op_type in ("MatMul", "Gemm"):  # HF heads: Gemm
            names.append(node.name)
        stack.extend(node.input)
    return names


_GELU = {"Gelu", "BiasGelu", "FastGelu", "Erf"}


def node_roles(model) -> dict[str, list[str]]:
    """Node names by role in a fused BERT graph (graph order is topological):

    ``head`` (:func:`head_nodes`), ``embeddings`` (EmbedLayerNormalization / embedding Gathers),
    ``attention`` (the fused Attention ops: Q/K/V projections), ``attn_out`` (the MatMul after
    each Attention), ``ffn_in`` / ``ffn_out`` (the feed-forward MatMuls before / after the GELU),
    ``last_block`` (the Attention and MatMuls of the last encoder block).
    """
    graph = model.graph
    prod = producers(graph)
    head = set(head_nodes(model))
    roles: dict[str, list[str]] = {
        k: [] for k in ("head", "embeddings", "attention", "attn_out", "ffn_in", "ffn_out", "last_block")
    }
    roles["head"] = sorted(head)
    consumers_of: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers_of.setdefault(name, []).append(node)
    ids = set(graph_inputs(model))
    blocks: list[list[str]] = []
    after_attention = False
    for node in graph.node:
        if node.op_type == "EmbedLayerNormalization" or (node.op_type == "Gather" and node.input[-1] in ids):
            roles["embeddings"].append(node.name)
        elif node.op_type == "Attention":
            roles["attention"].append(node.name)
            blocks.append([node.name])
            after_attention = True
        elif node.op_type == "MatMul" and node.name not in head:
            if blocks:
                blocks[-1].append(node.name)
            src = prod.get(node.input[0])
            nxt = [c.op_type for c in consumers_of.get(node.output[0], [])]
            if after_attention:
                roles["attn_out"].append(node.name)
                after_attention = False
            elif src is not None and src.op_type in _GELU:
                roles["ffn_out"].append(node.name)
            elif any(t in _GELU for t in nxt) or (nxt == ["Add"] and _feeds_gelu(node, consumers_of)):
                roles["ffn_in"].append(node.name)
    roles["last_block"] = blocks[-1] if blocks else []
    return roles


def _feeds_gelu(node, consumers_of) -> bool:
    return any(
        c.op_type in _GELU for add in consumers_of.get(node.output[0], []) for c in consumers_of.get(add.output[0], [])
    )
