"""Serving profiles fp32-fused and int8 through the real release core (export → convert → validate)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from seqcls.config import ReleaseConfig
from seqcls.errors import ConversionError
from seqcls.steps import run_release
from seqcls.workspace import open_release

pytestmark = pytest.mark.slow


def _ops(path: Path) -> Counter:
    import onnx

    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def _io(path: Path) -> tuple[list, list]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inputs = [(i.name, i.type.tensor_type.elem_type, len(i.type.tensor_type.shape.dim)) for i in model.graph.input]
    return inputs, [o.name for o in model.graph.output]


def test_fp32_fused_fuses_attention_and_passes_the_exact_gate(tiny_checkpoint: Path) -> None:
    release = open_release(tiny_checkpoint, ReleaseConfig(profile="fp32-fused"))
    results = run_release(release, until="validate")
    assert [r.status for r in results] == ["ok", "ok", "ok"]
    ws = release.workspace
    facts = ws.step("convert")["summary"]
    opt = facts["optimize"]
    # the tiny model has 2 layers: every attention block fused, plus the other BERT fusions
    assert opt["attention_blocks"] == 2 and opt["attention_fused"] == 2
    assert opt["fusions"]["Attention"] == 2 and opt["fusions"]["SkipLayerNormalization"] >= 2
    assert opt["fusions"]["EmbedLayerNormalization"] == 1
    assert opt["preprocess"]["masks_rewritten"] == 1 and opt["preprocess"]["query_scales_moved"] == 2
    assert opt["self_check"]["tolerance_ratio"] < 1.0
    served = ws.path("onnx/served.onnx")
    ops = _ops(served)
    assert ops["Attention"] == 2 and ops["Softmax"] == 0
    assert _io(served) == ([("input_ids", 7, 2), ("token_type_ids", 7, 2)], ["logits"])
    report = json.loads(ws.path("parity/report.json").read_text())
    assert report["profile"] == "fp32-fused" and report["passed"]
    assert report["numeric"]["gating"] and report["numeric"]["passed"]
    assert report["numeric"]["logits_max_abs_diff"] < 1e-4
    assert report["decisions"]["changed"] == 0
    expected = json.loads(ws.path("parity/expected.json").read_text())
    assert len(expected["items"]) == report["texts"]


def test_int8_is_gated_on_decision_agreement(tiny_checkpoint: Path) -> None:
    release = open_release(tiny_checkpoint, ReleaseConfig(profile="int8"))
    run_release(release, until="validate")
    ws = release.workspace
    opt = ws.step("convert")["summary"]["optimize"]
    assert opt["quantization"]["weight_type"] == "QInt8" and opt["attention_fused"] == 2
    assert opt["quantization"]["fp32_nodes"]  # the classification head stays fp32
    served = ws.path("onnx/served.onnx")
    ops = _ops(served)
    assert ops["QAttention"] == 2 and ops["MatMulInteger"] > 0
    assert served.stat().st_size < ws.path("onnx/model.onnx").stat().st_size / 2
    assert _io(served)[1] == ["logits"]
    report = json.loads(ws.path("parity/report.json").read_text())
    assert report["profile"] == "int8" and report["passed"]
    assert report["numeric"]["gating"] is False  # logits move under INT8: reported, not gated
    dc = report["decisions"]
    assert dc["min_agreement"] == 0.995 and dc["agreement"] >= 0.995
    # the report lists every changed decision (none or a few on this model)
    assert isinstance(dc["changes"], list) and len(dc["changes"]) == dc["changed"]
    for change in dc["changes"]:
        assert {"index", "paddle", "onnxruntime", "near_threshold"} <= set(change)


def test_optimize_rejects_bad_input(tmp_path: Path) -> None:
    from seqcls.optimize import optimize_onnx

    with pytest.raises(ConversionError, match="unknown profile"):
        optimize_onnx(tmp_path / "x.onnx", tmp_path / "y.onnx", "fp16", num_heads=2, hidden_size=32)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ConversionError, match="missing or empty"):
        optimize_onnx(empty, tmp_path / "y.onnx", "fp32-fused", num_heads=2, hidden_size=32)
    with pytest.raises(ConversionError, match="not a multiple"):
        _tiny_onnx_then(tmp_path, num_heads=3, hidden_size=32)


def _tiny_onnx_then(tmp_path: Path, *, num_heads: int, hidden_size: int) -> None:
    import onnx
    from onnx import TensorProto, helper

    from seqcls.optimize import optimize_onnx

    graph = helper.make_graph(
        [helper.make_node("Identity", ["input_ids"], ["logits"])],
        "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("logits", TensorProto.INT64, ["b", "s"])],
    )
    path = tmp_path / "identity.onnx"
    onnx.save(helper.make_model(graph), str(path))
    optimize_onnx(path, tmp_path / "out.onnx", "fp32-fused", num_heads=num_heads, hidden_size=hidden_size)


def test_fused_model_keeps_masking_exact_for_any_padding(tiny_checkpoint: Path) -> None:
    """The fused Attention masks exactly the pad positions (raw 2-D mask), wherever they are."""
    import numpy as np
    import onnxruntime as ort

    release = open_release(tiny_checkpoint, ReleaseConfig(profile="fp32-fused"))
    run_release(release, until="convert")
    ws = release.workspace
    ref = ort.InferenceSession(str(ws.path("onnx/model.onnx")), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(str(ws.path("onnx/served.onnx")), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    ids = rng.integers(5, release.checkpoint.vocab_size, size=(4, 20)).astype(np.int64)
    ids[1, 12:] = 0  # right padding
    ids[2, 3] = 0  # a pad id in the middle
    ids[3, 0:2] = 0  # left padding
    feeds = {"input_ids": ids, "token_type_ids": np.zeros_like(ids)}
    a, b = ref.run(["logits"], feeds)[0], got.run(["logits"], feeds)[0]
    np.testing.assert_allclose(b, a, atol=1e-4, rtol=1e-3)
