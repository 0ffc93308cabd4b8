"""Serving profiles fp32-fused and int8 on Hugging Face checkpoints (BERT, DeBERTa-v2): export →
convert → validate through the release core, on the tiny checkpoints of ``hf_checkpoints_src``.

BERT fuses like ERNIE (EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu);
DeBERTa-v2's disentangled attention matches no ORT Attention pattern, so only its LayerNorm /
SkipLayerNorm / Gelu fuse. int8 keeps the heads (Gemm in PyTorch's export) in fp32 and is
checked on the checkpoint's golden texts as the exported ``tokenizer.json`` tokenizes them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from seqcls.config import ReleaseConfig
from tests.helpers.checkpoints import HF_GOLDEN

INPUTS = {"bert": ["input_ids", "token_type_ids", "attention_mask"], "deberta-v2": ["input_ids", "attention_mask"]}


def _ops(path: Path) -> Counter:
    import onnx

    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def _released(src: Path, profile: str):
    from seqcls.release.intake import open_release
    from seqcls.steps import run_release

    release = open_release(src, ReleaseConfig(model_name=f"hf-{profile}", profile=profile))
    results = run_release(release, until="validate")
    assert [r.status for r in results] == ["ok", "ok", "ok"]
    ws = release.workspace
    report = json.loads(ws.path("parity/report.json").read_text())
    assert report["profile"] == profile and report["passed"], report
    assert report["texts"] == len(HF_GOLDEN)
    return release, ws.step("convert")["summary"], report


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["bert", "deberta-v2"])
def test_fp32_fused_passes_the_exact_gate(hf_checkpoints_src: dict[str, Path], arch: str) -> None:
    release, facts, report = _released(hf_checkpoints_src[arch], "fp32-fused")
    opt = facts["optimize"]
    assert opt["inputs"] == INPUTS[arch] and facts["inputs"] == INPUTS[arch]
    assert opt["self_check"]["tolerance_ratio"] < 1.0
    ops = _ops(release.workspace.path("onnx/served.onnx"))
    if arch == "bert":  # fused like ERNIE
        assert opt["attention_fused"] == opt["attention_blocks"] == 2 and ops["Attention"] == 2
        assert ops["EmbedLayerNormalization"] == 1 and ops["SkipLayerNormalization"] >= 2
    else:  # disentangled attention stays unfused; the normalisations fuse, the opset is raised for them
        assert opt["attention_fused"] == 0 and ops["Attention"] == 0
        assert ops["SkipLayerNormalization"] >= 2 and opt["opset_raised"]["to"] == 17
    assert report["numeric"]["gating"] and report["numeric"]["passed"]
    assert report["numeric"]["logits_max_abs_diff"] < 1e-4
    assert report["decisions"]["changed"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["bert", "deberta-v2"])
def test_int8_quantizes_and_passes_the_decision_gate(hf_checkpoints_src: dict[str, Path], arch: str) -> None:
    import onnx

    from seqcls.release.records import serving_tokenizer
    from seqcls.steps.convert import calibration

    release, facts, report = _released(hf_checkpoints_src[arch], "int8")
    q = facts["optimize"]["quantization"]
    assert q["method"] == "dynamic" and q["attempts"][0]["recipe"] == "dynamic"
    # the heads PyTorch exports as Gemm stay fp32 (ORT's quantizer turns a Gemm into <name>_MatMul + Add);
    # where the dynamic recipe agreed too little on this CPU's int8 kernels (tiny BERT on an AMX/VNNI host:
    # 0.976), the fallback recipe keeps the feed-forward outputs in fp32 too, and only those
    heads = [name for name in q["fp32_nodes"] if name.endswith("Gemm")]
    others = [name for name in q["fp32_nodes"] if not name.endswith("Gemm")]
    assert heads, q["fp32_nodes"]
    if len(q["attempts"]) == 1:
        assert not others, q["fp32_nodes"]
    else:
        assert q["attempts"][-1]["recipe"] == "dynamic-ffn_out-fp32", q["attempts"]
        assert others and all(name.endswith("/output/dense/MatMul") for name in others), others
    assert q["calibration"] == {**q["calibration"], "source": "checkpoint golden.txt", "texts": len(HF_GOLDEN)}
    served = release.workspace.path("onnx/served.onnx")
    ops = _ops(served)
    assert ops["MatMulInteger"] >= 4 and not ops["Gemm"]
    if arch == "bert":
        assert ops["QAttention"] == 2 and ops["EmbedLayerNormalization"] == 1
    nodes = {n.name: n.op_type for n in onnx.load(str(served)).graph.node}
    assert all(nodes.get(f"{name}_MatMul") == "MatMul" for name in heads)  # the head, unquantized
    assert all(nodes.get(name) == "MatMul" for name in others)  # fallback's fp32 layers, unquantized
    assert report["numeric"]["gating"] is False
    assert report["decisions"]["agreement"] >= 0.995 and report["decisions"]["min_agreement"] == 0.995
    # calibrated as Triton tokenizes: the exported tokenizer.json and its pad id, not vocab.txt
    cal, tok = calibration(release), serving_tokenizer(release)
    assert tok.kind == "tokenizer.json" and cal.tokenizer_file == tok.file and cal.pad_id == tok.pad_id
    assert cal.vocab_file is None and cal.texts == HF_GOLDEN
    feeds = cal.batches(INPUTS[arch])
    assert all(sorted(f) == sorted(INPUTS[arch]) for f in feeds)


def test_toposort_sees_what_subgraphs_read() -> None:
    """An ``If`` whose branch reads an outer value produced after it (the order ORT's quantizer
    left in DeBERTa-v2's graph): re-sorted, and then the checker accepts it."""
    import onnx
    from onnx import TensorProto, helper

    from seqcls.profiles.fusion import outer_scope_inputs, toposort

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    branch_out = helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])
    then = helper.make_graph([helper.make_node("Identity", ["late"], ["b"])], "then", [], [branch_out])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["b"])], "else", [], [branch_out])
    nodes = [
        helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then, else_branch=other),
        helper.make_node("Neg", ["x"], ["late"], name="late"),
        helper.make_node(
            "Constant", [], ["cond"], name="cond", value=helper.make_tensor("c", TensorProto.BOOL, [], [1])
        ),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [out]), opset_imports=[helper.make_opsetid("", 14)])
    assert outer_scope_inputs(model.graph.node[0]) == {"late", "x"}
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(model)
    assert toposort(model.graph) is True
    assert [n.name for n in model.graph.node][-1] == "if"
    onnx.checker.check_model(model)
    assert toposort(model.graph) is False  # already sorted: untouched
