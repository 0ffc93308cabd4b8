"""Serving profiles fp32-fused, int8 and fp16 through the real release core (export → convert → validate)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from seqcls.checkpoints.golden import DEFAULT_GOLDEN_TEXTS
from seqcls.config import ReleaseConfig
from seqcls.errors import ConversionError
from seqcls.profiles.optimize import INT8_MARGIN
from seqcls.release.intake import open_release
from seqcls.steps import run_release

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
    q = opt["quantization"]
    assert q["name"] == "dynamic" and q["method"] == "dynamic" and opt["attention_fused"] == 2
    assert q["fp32_nodes"]  # the classification head stays fp32
    # measured on the golden texts the gate uses (the built-in set here), as serving tokenizes them
    assert q["calibration"]["source"] == "built-in golden set"
    assert q["calibration"]["texts"] == len(DEFAULT_GOLDEN_TEXTS)
    assert q["target_agreement"] == pytest.approx(0.995 + INT8_MARGIN)
    assert [a["recipe"] for a in q["attempts"]] == ["dynamic"] and q["agreement"]["agreement"] >= 0.996
    served = ws.path("onnx/served.onnx")
    ops = _ops(served)
    assert ops["QAttention"] == 2 and ops["MatMulInteger"] > 0
    assert ops["EmbedLayerNormalization"] == 1 and not ops["QEmbedLayerNormalization"]  # embeddings fp32
    # smaller, though not by 4x: the embedding tables (most of a tiny model) stay fp32
    assert served.stat().st_size < ws.path("onnx/model.onnx").stat().st_size * 0.75
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
    from seqcls.profiles.optimize import optimize_onnx

    with pytest.raises(ConversionError, match="unknown profile"):
        optimize_onnx(tmp_path / "x.onnx", tmp_path / "y.onnx", "fp8", num_heads=2, hidden_size=32)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ConversionError, match="missing or empty"):
        optimize_onnx(empty, tmp_path / "y.onnx", "fp32-fused", num_heads=2, hidden_size=32)
    with pytest.raises(ConversionError, match="not a multiple"):
        _tiny_onnx_then(tmp_path, num_heads=3, hidden_size=32)


def _tiny_onnx_then(tmp_path: Path, *, num_heads: int, hidden_size: int) -> None:
    import onnx
    from onnx import TensorProto, helper

    from seqcls.profiles.optimize import optimize_onnx

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


# ----------------------------------------------------------------------------- graph inputs, INT8 recipes


@pytest.fixture(scope="module")
def tiny_onnx(tiny_checkpoint_src: Path, tmp_path_factory: pytest.TempPathFactory):
    """The tiny checkpoint converted once (profile fp32): (release, model.onnx)."""
    from seqcls.release.records import fp32_onnx
    from seqcls.settings import Settings

    home = tmp_path_factory.mktemp("optimize-home")
    release = open_release(tiny_checkpoint_src, ReleaseConfig(profile="fp32"), Settings(home=home))
    run_release(release, until="convert")
    return release, fp32_onnx(release.workspace)


def _with_inputs(src: Path, dst: Path, names: tuple[str, ...]) -> Path:
    """The Paddle graph rewritten to take ``names`` as an HF export does: the padding mask from
    ``attention_mask == 0`` instead of ``input_ids == pad``; without ``token_type_ids`` the
    segment embedding looks up zeros."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    if "attention_mask" in names:
        graph.input.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]))
        graph.initializer.append(numpy_helper.from_array(np.array(0, dtype=np.int64), "mask_zero"))
        equal = next(n for n in graph.node if n.op_type == "Equal" and "input_ids" in n.input)
        equal.input[:] = ["attention_mask", "mask_zero"]
    if "token_type_ids" not in names:  # no segment embedding at all (DeBERTa-v2, type_vocab_size 0)
        gather = next(n for n in graph.node if n.op_type == "Gather" and n.input[1] == "token_type_ids")
        add = next(n for n in graph.node if gather.output[0] in n.input)
        other = next(x for x in add.input if x != gather.output[0])
        for node in graph.node:
            node.input[:] = [other if x == add.output[0] else x for x in node.input]
        graph.node.remove(gather)
        graph.node.remove(add)
        keep = [i for i in graph.input if i.name != "token_type_ids"]
        del graph.input[:]
        graph.input.extend(keep)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(dst))
    return dst


def _calibration(release, **kwargs):
    from seqcls.profiles.optimize import Calibration

    ckpt = release.checkpoint
    return Calibration(DEFAULT_GOLDEN_TEXTS, "built-in golden set", ckpt.vocab_file, ckpt.do_lower_case, 128, **kwargs)


@pytest.mark.parametrize(
    "names",
    [("input_ids", "token_type_ids", "attention_mask"), ("input_ids", "attention_mask")],
    ids=["bert", "deberta"],
)
def test_optimize_uses_the_graphs_own_inputs(tiny_onnx, tmp_path: Path, names: tuple[str, ...]) -> None:
    """An HF-style graph (attention_mask; maybe no token_type_ids) is fused and quantized with
    feeds for exactly its inputs, the mask deciding what is padding."""
    import numpy as np
    import onnxruntime as ort

    from seqcls.profiles.optimize import optimize_onnx

    release, model = tiny_onnx
    src = _with_inputs(model, tmp_path / "hf.onnx", names)
    for profile in ("fp32-fused", "int8"):
        out = tmp_path / f"{profile}.onnx"
        kwargs = {"calibration": _calibration(release)} if profile == "int8" else {}
        report = optimize_onnx(src, out, profile, num_heads=2, hidden_size=32, **kwargs)
        assert report["inputs"] == list(names)
        assert [i[0] for i in _io(out)[0]] == list(names) and _io(out)[1] == ["logits"]
        assert report["attention_fused"] == 2
        if profile == "int8":
            cal = report["quantization"]["calibration"]
            assert cal["texts"] > 0 and cal["source"] == "built-in golden set"
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(str(tmp_path / "fp32-fused.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    ids = rng.integers(5, release.checkpoint.vocab_size, size=(3, 16)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 4:] = 0
    feeds = {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "attention_mask": mask}
    feeds = {k: v for k, v in feeds.items() if k in names}
    a, b = ref.run(["logits"], feeds)[0], got.run(["logits"], feeds)[0]
    np.testing.assert_allclose(b, a, atol=1e-4, rtol=1e-3)
    other = dict(feeds, input_ids=np.where(mask == 1, ids, 7))  # masked positions' ids do not matter
    np.testing.assert_allclose(got.run(["logits"], other)[0], b, atol=1e-5)


def test_contract_check_names_unknown_or_changed_inputs(tiny_onnx, tmp_path: Path) -> None:
    import onnx

    from seqcls.profiles.checks import check_contract, graph_inputs

    _, model_path = tiny_onnx
    model = onnx.load(str(model_path), load_external_data=False)
    assert graph_inputs(model) == ("input_ids", "token_type_ids")
    with pytest.raises(ConversionError, match="'attention_mask' missing"):
        check_contract(model, "test", ("input_ids", "token_type_ids", "attention_mask"))
    with pytest.raises(ConversionError, match=r"unexpected inputs \['token_type_ids'\]"):
        check_contract(model, "test", ("input_ids",))
    model.graph.input[1].name = "position_ids"
    with pytest.raises(ConversionError, match="not in the serving contract"):
        graph_inputs(model)


@pytest.fixture(scope="module")
def tiny_fused(tiny_onnx, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from seqcls.profiles.optimize import optimize_onnx

    _, model = tiny_onnx
    out = tmp_path_factory.mktemp("fused") / "fused.onnx"
    optimize_onnx(model, out, "fp32-fused", num_heads=2, hidden_size=32)
    return out


def test_int8_recipe_keeps_the_named_roles_fp32(tiny_fused: Path, tmp_path: Path) -> None:
    import onnx

    from seqcls.profiles.optimize import Int8Recipe, node_roles, quantize_int8

    roles = node_roles(onnx.load(str(tiny_fused), load_external_data=False))
    assert len(roles["attention"]) == 2 and len(roles["ffn_out"]) == 2 and len(roles["ffn_in"]) == 2
    assert len(roles["attn_out"]) == 2 and roles["embeddings"] and roles["head"]
    assert roles["last_block"][0] == roles["attention"][-1] and len(roles["last_block"]) == 4
    recipe = Int8Recipe("t", op_types=("MatMul", "Attention"), fp32=("head", "last_block"))
    facts = quantize_int8(tiny_fused, tmp_path / "q.onnx", recipe)
    assert set(facts["fp32_nodes"]) == set(roles["head"]) | set(roles["last_block"])
    nodes = {n.name: n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node}
    assert all(nodes[name] in ("MatMul", "Attention") for name in facts["fp32_nodes"])  # untouched, by name
    ops = _ops(tmp_path / "q.onnx")
    assert ops["QAttention"] == 1 and ops["Attention"] == 1 and ops["EmbedLayerNormalization"] == 1


def test_int8_profile_moves_fewer_decisions_than_the_old_recipe(tiny_onnx, tiny_fused: Path, tmp_path: Path) -> None:
    """Measured on the golden texts (serving-tokenized): the profile's recipe (embeddings fp32)
    stays closer to fp32 than the pre-issue-16 one (which quantized the embedding tables too)."""
    import onnx

    from seqcls.profiles.optimize import INT8, Int8Recipe, decision_agreement, graph_inputs, quantize_int8

    INT8_V1 = Int8Recipe("dynamic-all", op_types=(), fp32=("head",))  # the int8 recipe before issue 16

    release, _ = tiny_onnx
    feeds = _calibration(release).batches(graph_inputs(onnx.load(str(tiny_fused), load_external_data=False)))
    scores = {}
    for recipe in (INT8_V1, INT8):
        out = tmp_path / f"{recipe.name}-{id(recipe)}.onnx"
        quantize_int8(tiny_fused, out, recipe)
        scores[recipe is INT8] = decision_agreement(tiny_fused, out, feeds)
    old, new = scores[False], scores[True]
    assert new["prob_max_abs_diff"] < old["prob_max_abs_diff"]
    assert new["agreement"] >= old["agreement"] and new["agreement"] >= 0.996


def test_int8_falls_back_to_more_fp32_when_decisions_move(tiny_onnx, tmp_path: Path, caplog) -> None:
    """A recipe that misses the gate's minimum + margin on the calibration texts is replaced by
    the next of INT8_FALLBACKS; every attempt is reported."""
    from seqcls.profiles.optimize import INT8, INT8_FALLBACKS, optimize_onnx

    release, model = tiny_onnx
    unreachable = _calibration(release, min_agreement=1.0)  # target 1.001: no recipe reaches it
    with caplog.at_level("WARNING", logger="seqcls.profiles.quantize"):
        report = optimize_onnx(model, tmp_path / "q.onnx", "int8", num_heads=2, hidden_size=32, calibration=unreachable)
    q = report["quantization"]
    assert [a["recipe"] for a in q["attempts"]] == [INT8.name, *(r.name for r in INT8_FALLBACKS)]
    assert q["name"] == INT8_FALLBACKS[-1].name
    assert "no recipe left: the gate decides" in caplog.text
    assert _ops(tmp_path / "q.onnx")["MatMul"] == 2 + 2  # head + the feed-forward outputs kept fp32


def test_fusion_left_layernorm_keeps_the_model_valid(tiny_onnx, tmp_path: Path) -> None:
    """Token types computed inside the graph: ORT fuses no EmbedLayerNormalization and leaves an
    ONNX LayerNormalization in an opset-14 graph, which the checker rejects unless the opset is raised."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from seqcls.profiles.optimize import optimize_onnx

    _, model_path = tiny_onnx
    model = onnx.load(str(model_path))
    graph = model.graph
    graph.initializer.append(numpy_helper.from_array(np.array(0, dtype=np.int64), "type_zero"))
    for node in graph.node:
        node.input[:] = ["token_types" if x == "token_type_ids" else x for x in node.input]
    graph.node.insert(0, helper.make_node("Mul", ["input_ids", "type_zero"], ["token_types"], name="token_types"))
    keep = [i for i in graph.input if i.name != "token_type_ids"]
    del graph.input[:]
    graph.input.extend(keep)
    src = tmp_path / "computed-types.onnx"
    onnx.save(model, str(src))
    report = optimize_onnx(src, tmp_path / "out.onnx", "fp32-fused", num_heads=2, hidden_size=32)
    assert report["opset_raised"]["from"] == 14 and report["inputs"] == ["input_ids"]
    assert _ops(tmp_path / "out.onnx")["LayerNormalization"] >= 1 and report["self_check"]["tolerance_ratio"] < 1


# ----------------------------------------------------------------------------- fp16 (GPU; no GPU here)


def test_fp16_is_refused_on_a_cpu_only_host_before_any_work(tiny_checkpoint: Path) -> None:
    from seqcls.errors import InputError
    from seqcls.spec import host_refusal
    from seqcls.steps.preflight import preflight

    release = open_release(tiny_checkpoint, ReleaseConfig(profile="fp16"))
    with pytest.raises(InputError, match=r"runs on ONNX Runtime's CUDAExecutionProvider only.*fp32-fused or int8"):
        preflight(release, servers=())  # what `seqcls release` and the DAG's first task run
    with pytest.raises(ConversionError, match="CUDAExecutionProvider only"):  # the step alone refuses too
        run_release(release, until="convert")
    assert not release.workspace.path("onnx/served.onnx").exists()
    # publishing an fp16 graph (converted on a GPU host) for CPU serving is refused the same way
    assert "SEQCLS_DEVICE=gpu" in host_refusal("fp16", device="cpu")
    assert host_refusal("fp16", providers=("CUDAExecutionProvider", "CPUExecutionProvider"), device="gpu") is None
    assert host_refusal("int8", providers=("CPUExecutionProvider",), device="cpu") is None


def test_fp16_graph_keeps_the_contract_and_the_head_fp32(tiny_onnx, tmp_path: Path) -> None:
    """Built as on a GPU host (CUDA named first). No CUDA here, so ONNX Runtime falls back to the CPU,
    which runs the fp16 nodes through inserted casts: the conversion and the contract are checked
    offline, not CUDA's fp16 arithmetic (the parity and quality gates judge that on the GPU host)."""
    import onnx

    from seqcls.profiles.optimize import optimize_onnx

    _, model = tiny_onnx
    out = tmp_path / "fp16.onnx"
    cuda = ("CUDAExecutionProvider", "CPUExecutionProvider")
    with pytest.warns(UserWarning, match="CUDAExecutionProvider"):  # ORT: not available, CPU used
        facts = optimize_onnx(model, out, "fp16", num_heads=2, hidden_size=32, providers=cuda)
    graph = onnx.load(str(out)).graph
    assert _io(out) == ([("input_ids", 7, 2), ("token_type_ids", 7, 2)], ["logits"])
    assert graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # the served contract: fp32
    kinds = Counter(i.data_type for i in graph.initializer)
    assert kinds[onnx.TensorProto.FLOAT16] > kinds[onnx.TensorProto.FLOAT] > 0
    kept = set(facts["fp16"]["kept_fp32"])
    assert len(kept) == 2  # the pooler's and the classifier's MatMul
    weights = {i.name: i.data_type for i in graph.initializer}
    head = [n for n in graph.node if n.name in kept]
    assert len(head) == 2 and all(weights[n.input[1]] == onnx.TensorProto.FLOAT for n in head)
    assert 0 < facts["self_check"]["logits_max_abs_diff"] < 0.05  # fp16 weights: close, not equal
    assert out.stat().st_size < model.stat().st_size * 0.75


def test_fusion_does_not_depend_on_ort_transformers_staying_on_sys_path(
    tiny_onnx, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``onnxruntime.transformers`` appends its own directory to ``sys.path`` once, at first import, and its
    optimizer imports ``fusion_options`` & co. by their top-level names. A host that restores ``sys.path``
    afterwards (pytest's monkeypatch, an app sandboxing imports) removed it: the next fusion failed with
    ``No module named 'fusion_options'`` (a CI run, after a test that restored ``sys.path``)."""
    import sys

    import onnxruntime.transformers as ort_transformers

    from seqcls.profiles.optimize import optimize_onnx

    here = str(Path(ort_transformers.__file__).parent)
    for name, module in list(sys.modules.items()):  # as if only the package had been imported so far
        origin = str(getattr(module, "__file__", "") or "")
        if name.startswith("onnxruntime.transformers.") or (origin.startswith(here) and "." not in name):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != here])
    _, model = tiny_onnx
    report = optimize_onnx(model, tmp_path / "fused.onnx", "fp32-fused", num_heads=2, hidden_size=32)
    assert report["attention_fused"] == 2
