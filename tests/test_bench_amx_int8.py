"""The AMX-INT8 study's quantizer and comparison (seqcls_tools.bench.amx_int8) on the tiny checkpoint: the
statically quantized graph really is quantized (a graph left fp32 would compare as a perfect, slow int8)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from seqcls.config import ReleaseConfig
from seqcls.release.intake import open_release
from seqcls.steps import run_release
from seqcls_tools.bench import amx_int8

pytestmark = pytest.mark.slow


def test_the_static_graph_quantizes_every_matmul_but_the_head_and_runs_on_openvino(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    import onnx

    release = open_release(tiny_checkpoint, ReleaseConfig(profile="fp32"))
    run_release(release, until="convert")
    src, dst = release.workspace.path("onnx/model.onnx"), tmp_path / "qdq.onnx"
    feeds = amx_int8._feeds(release, ["某科技公司宣布裁员。", "A startup raises a series B round.", "球队夺冠"] * 4)
    amx_int8._quantize_static(src, dst, feeds, labels=release.checkpoint.num_labels)
    model = onnx.load(str(dst))
    weights = {i.name: tuple(i.dims) for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    fed = Counter(
        "quantized" if producers.get(n.input[1]) is not None and producers[n.input[1]].op_type == "DequantizeLinear"
        else "head" if weights.get(n.input[1], (0,))[-1] == release.checkpoint.num_labels
        else "other"
        for n in matmuls
    )  # fmt: skip
    assert fed["head"] == 1 and fed["quantized"] >= 4, fed  # 2 layers × (q, k, v, out, ffn in, ffn out)
    reference = [amx_int8._Ort(src, 1).run(f) for f in feeds]
    logits = [amx_int8._OpenVINO(dst, "f32", 1).run(f) for f in feeds]
    agreement = amx_int8._agreement(logits, reference)
    assert agreement["max_abs_logit_diff"] > 0  # it computed something else than fp32: it is quantized
    assert 0.5 <= agreement["decision_agreement"] <= 1.0
    assert all(np.isfinite(x).all() for x in logits)
