"""Fast tests of the serving source: config rendering (all runtimes/devices), shipped logic."""

from __future__ import annotations

import numpy as np
import pytest

from seqcls.contract import shipped
from seqcls.contract.names import ENSEMBLE, MODEL, MODELS
from seqcls.errors import InputError, ServingError
from seqcls.serving.repository import (
    Repository,
    ServingOptions,
    check_configs,
    parse_config,
    render_config,
)
from seqcls.settings import PROJECT_ROOT

SOURCE = PROJECT_ROOT / "model_repository"


def _render_all(options: ServingOptions, version: int = 3, labels: int = 7) -> dict[str, str]:
    return {m: render_config(SOURCE, m, options, version=version, num_labels=labels) for m in MODELS}


@pytest.mark.parametrize(
    "options",
    [
        ServingOptions(),
        ServingOptions.for_device("cpu", "onnxruntime"),
        ServingOptions.for_device("gpu"),
        ServingOptions.for_device("gpu", gpu_accelerator="tensorrt-fp16", model_instances=2),
        ServingOptions(dynamic_batching=False, batching="per-request", graph_optimization_level="basic"),
        ServingOptions(padding="buckets", batching="group-by-length", buckets=(8, 16, 32)),
    ],
    ids=["cpu-python-ort", "cpu-native-ort", "gpu", "gpu-trt-fp16", "classic-like", "cpu-buckets"],
)
def test_every_profile_renders_and_parses(options: ServingOptions) -> None:
    configs = _render_all(options)
    check_configs(configs, 3)
    model = parse_config(configs[MODEL])
    assert model.max_batch_size == options.max_batch_size
    assert list(model.version_policy.specific.versions) == [3]
    assert model.HasField("dynamic_batching") == options.dynamic_batching
    # ragged batches for the python model only (it takes each request at its own shape); the native
    # backend would concatenate them into one flat tensor
    assert {i.allow_ragged_batch for i in model.input} == {options.runtime == "python-onnxruntime"}
    delay = model.dynamic_batching.max_queue_delay_microseconds
    assert delay == (2000 if options.device == "gpu" else 0) or not options.dynamic_batching
    if options.runtime == "onnxruntime":
        assert model.backend == "onnxruntime" and list(model.output[0].dims) == [7]
        assert model.instance_group[0].kind == (2 if options.device == "cpu" else 1)  # KIND_CPU=2, KIND_GPU=1
    else:
        params = {k: v.string_value for k, v in model.parameters.items()}
        assert model.backend == "python" and params["batching"] == options.batching
    if options.gpu_accelerator == "tensorrt-fp16":
        acc = model.optimization.execution_accelerators.gpu_execution_accelerator[0]
        assert acc.name == "tensorrt" and acc.parameters["precision_mode"] == "FP16"
    ens = parse_config(configs[ENSEMBLE])
    assert [s.model_version for s in ens.ensemble_scheduling.step] == [3, 3, 3]


def test_bad_options_and_configs_are_rejected() -> None:
    with pytest.raises(InputError, match="padding='pad-everything'"):
        ServingOptions(padding="pad-everything")
    with pytest.raises(InputError, match="GPU needs runtime 'onnxruntime'"):
        ServingOptions(device="gpu", runtime="python-onnxruntime")
    with pytest.raises(ServingError, match="not a valid Triton model config"):
        parse_config('name: "x"\nmax_batch_size: lots\n')
    configs = _render_all(ServingOptions())
    configs[ENSEMBLE] = configs[ENSEMBLE].replace(
        'model_version: 3\n      input_map { key: "input_ids"', 'model_version: 2\n      input_map { key: "input_ids"'
    )
    with pytest.raises(ServingError, match="pins version 2, not 3"):
        check_configs(configs, 3)


def test_config_for_rewrites_only_the_policy(tmp_path) -> None:
    repo = Repository(tmp_path, SOURCE)
    text = render_config(SOURCE, MODEL, ServingOptions(), version=4, num_labels=7)
    (tmp_path / MODEL / "4").mkdir(parents=True)
    (tmp_path / MODEL / "4" / "config.snapshot.pbtxt").write_text(text)
    live = repo.config_for(MODEL, 4, [3, 4])
    assert list(parse_config(live).version_policy.specific.versions) == [3, 4]
    assert live.replace("[ 3, 4 ]", "[ 4 ]") == text
    repo.write_config(MODEL, live)
    assert repo.live_versions(MODEL) == [3, 4]


def test_padding_strategies() -> None:
    text = shipped.text()
    ids = [[1, 5, 2], [1, 5, 6, 7, 8, 2]]
    a, t = text.pad(ids, strategy="longest")
    assert a.shape == (2, 6) and a.dtype == np.int64 and not t.any() and a[0, 3:].tolist() == [0, 0, 0]
    assert text.pad(ids, strategy="buckets", buckets=(4, 8, 16))[0].shape == (2, 8)
    assert text.pad(ids, strategy="max_length", max_length=32)[0].shape == (2, 32)
    assert text.padded_length([130], strategy="buckets", max_length=128) == 130  # never below the longest
    assert text.padded_length([100], strategy="buckets", max_length=128, buckets=(64, 256)) == 128


def test_decode_utf8_errors_per_item() -> None:
    texts, errors = shipped.text().decode_utf8([b"ok", b"\xff\xfe", "str", b""])
    assert texts == ["ok", "", "str", ""]
    assert errors[0] is None and "not valid UTF-8" in errors[1] and errors[2] is None and errors[3] is None


def test_decide_thresholds_and_hierarchy() -> None:
    d = shipped.decide()
    labels = ["体育", "体育##夺冠", "财经", "财经##融资"]
    th = d.threshold_vector(labels, 0.5, {"财经##融资": 0.9})
    probs = np.array([[0.2, 0.8, 0.1, 0.1], [0.1, 0.1, 0.7, 0.85], [0.6, 0.1, 0.1, 0.95]], dtype=np.float32)
    rows = d.decide(probs, th, labels)
    assert rows[0] == [("体育", pytest.approx(0.8)), ("体育##夺冠", pytest.approx(0.8))]  # parent implied
    assert [lbl for lbl, _ in rows[1]] == ["财经"]  # 0.85 < per-label 0.9
    assert [lbl for lbl, _ in rows[2]] == ["体育", "财经", "财经##融资"]
    assert [lbl for lbl, _ in d.decide(probs, th, labels, hierarchy=False)[0]] == ["体育##夺冠"]
    assert d.parse_thresholds('{"default": 0.4, "体育": 0.7}', labels).tolist() == pytest.approx([0.7, 0.4, 0.4, 0.4])
    with pytest.raises(ValueError, match="unknown labels: nope"):
        d.threshold_vector(labels, 0.5, {"nope": 0.3})
    assert d.near_threshold(np.array([[0.5004, 0.1]]), np.array([0.5, 0.5]), 1e-3).tolist() == [True]
    assert d.sigmoid(np.array([-1000.0, 0.0, 1000.0])).tolist() == [0.0, 0.5, 1.0]


# --- seqcls_model takes the inputs its graph declares (Paddle ERNIE, HF BERT, HF DeBERTa-v2) ---------

_WORDS, _TYPE_ROWS, _POSITIONS, _NUM_LABELS = 20, 3, 12, 4


def _graph(path, inputs: tuple[str, ...], *, cast_ids: bool = False, extra_input: str | None = None) -> None:
    """A miniature classifier over ``inputs``: embedding ``Gather``s (ids through a ``Cast`` as torch.onnx
    writes them when ``cast_ids``), mean over the real tokens (``attention_mask``, else ids ≠ 0), linear."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)

    ids = "ids_cast" if cast_ids else "input_ids"
    nodes = [helper.make_node("Cast", ["input_ids"], ["ids_cast"], to=TensorProto.INT64)] if cast_ids else []
    nodes += [
        helper.make_node("Gather", ["word", ids], ["w"]),
        helper.make_node("Shape", ["input_ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["length"]),
        helper.make_node("Range", ["zero", "length", "one"], ["position_ids"]),
        helper.make_node("Gather", ["positions", "position_ids"], ["p"]),
        helper.make_node("Add", ["w", "p"], ["wp"]),
    ]
    if "token_type_ids" in inputs:
        nodes += [
            helper.make_node("Gather", ["types", "token_type_ids"], ["t"]),
            helper.make_node("Add", ["wp", "t"], ["x"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["wp"], ["x"]))
    if "attention_mask" in inputs:
        nodes.append(helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT))
    else:
        nodes += [
            helper.make_node("Equal", [ids, "zero"], ["is_pad"]),
            helper.make_node("Not", ["is_pad"], ["is_token"]),
            helper.make_node("Cast", ["is_token"], ["mask"], to=TensorProto.FLOAT),
        ]
    nodes += [
        helper.make_node("Unsqueeze", ["mask", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["x", "mask3"], ["xm"]),
        helper.make_node("ReduceSum", ["xm", "axis1"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["mask", "axis1"], ["count"], keepdims=1),
        helper.make_node("Div", ["total", "count"], ["mean"]),
        helper.make_node("MatMul", ["mean", "classifier"], ["logits"]),
    ]
    inits = [
        init("word", _WORDS, 8),
        init("types", _TYPE_ROWS, 8),
        init("positions", _POSITIONS, 8),
        init("classifier", 8, _NUM_LABELS),
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
    ]
    names = [*inputs, *([extra_input] if extra_input else [])]
    declared = [helper.make_tensor_value_info(n, TensorProto.INT64, ["N", "L"]) for n in names]
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", _NUM_LABELS])
    graph = helper.make_graph(nodes, "mini", declared, [out], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), str(path))


@pytest.fixture
def seqcls_model(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """``seqcls_model(inputs, batching=..., **graph)`` → (model, onnx file): the shipped model.py over ``_graph``."""
    import sys

    from seqcls_tools.bench.per_text import load_model
    from seqcls_tools.fake_pb_utils import fake_pb_utils

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_pb_utils())
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "seqcls_backend", raising=False)

    def _load(inputs: tuple[str, ...], batching: str = "per-request", **graph):
        onnx_file = tmp_path / f"{'-'.join(inputs)}-{len(list(tmp_path.iterdir()))}.onnx"
        _graph(onnx_file, inputs, **graph)
        return load_model(onnx_file, tmp_path, batching=batching, threads=1), onnx_file

    yield _load
    sys.modules.pop("seqcls_backend", None)


def _req(ids, **others):
    from seqcls_tools.fake_pb_utils import request

    ids = np.asarray(ids, dtype=np.int64)
    return request(input_ids=ids, **{k: np.asarray(v, dtype=np.int64) for k, v in others.items()})


def _error(response) -> str | None:
    if response.error is None:
        return None
    assert response.error.code() == "INVALID_ARG", response.error.message()
    return response.error.message()


@pytest.mark.parametrize(
    ("inputs", "cast_ids"),
    [
        (("input_ids", "token_type_ids"), False),  # PaddleNLP ERNIE
        (("input_ids", "token_type_ids", "attention_mask"), True),  # HF BERT via torch.onnx (ids through Cast)
        (("input_ids", "attention_mask"), False),  # HF DeBERTa-v2 (no token types)
    ],
    ids=["paddle", "hf-bert", "hf-deberta"],
)
@pytest.mark.parametrize("batching", ["per-request", "pad-to-longest", "per-text"])
def test_model_takes_exactly_the_graph_s_inputs(seqcls_model, inputs, cast_ids: bool, batching: str) -> None:
    model, onnx_file = seqcls_model(inputs, batching=batching, cast_ids=cast_ids)
    assert model.inputs == inputs
    limits = {"input_ids": _WORDS, "positions": _POSITIONS}
    if "token_type_ids" in inputs:
        limits["token_type_ids"] = _TYPE_ROWS
    embedding_limits = type(model).initialize.__globals__["embedding_limits"]
    assert embedding_limits(str(onnx_file)) == limits  # through the Cast; attention_mask indexes no table
    assert (model.vocab_size, model.max_positions) == (_WORDS, _POSITIONS)
    mask = "attention_mask" in inputs

    def req(ids, types=None, attention=None):
        ids = np.asarray(ids)
        extra = {}
        if "token_type_ids" in inputs:
            extra["token_type_ids"] = np.zeros_like(ids) if types is None else types
        if mask:
            extra["attention_mask"] = (ids != 0).astype(np.int64) if attention is None else attention
        return _req(ids, **extra)

    good = [req([[1, 5, 6, 2], [1, 7, 2, 0]]), req([[1, 9, 9, 9, 8, 2]]), req([[1, 3, 2]])]
    hostile = [
        req([[1, _WORDS, 2]]),  # id == vocabulary size
        req([[1] * (_POSITIONS + 1)]),  # over max_position_embeddings
        _req([[1, 5, 2]]),  # only input_ids: the other inputs missing
        req([[1, 5, 2]], types=np.zeros((1, 2), np.int64), attention=np.ones((1, 2), np.int64)),  # shapes differ
    ]
    if mask:
        hostile.append(req([[1, 5, 2]], attention=[[1, 2, 1]]))  # mask not 0/1
    responses = model.execute([*good[:1], *hostile, *good[1:]])
    errors = [_error(r) for r in responses]
    assert errors[0] is None and errors[-1] is None and errors[-2] is None
    assert "input_ids must lie in [0, 20)" in errors[1]
    assert "sequence length 13 is over the model's max_position_embeddings 12" in errors[2]
    need = " and ".join(inputs) if len(inputs) == 2 else "input_ids, token_type_ids and attention_mask"
    assert f"needs {'both ' if len(inputs) == 2 else ''}{need}" in errors[3]
    assert "of the same shape" in errors[4]
    if mask:
        assert "attention_mask must be 0 or 1, got values from 1 to 2" in errors[5]
    for k, g in zip((0, -2, -1), good, strict=True):
        alone = model.execute([g])[0].outputs["logits"]
        np.testing.assert_allclose(responses[k].outputs["logits"], alone, rtol=1e-5, atol=1e-6)
    assert responses[0].outputs["logits"].shape == (2, _NUM_LABELS)


def test_model_refuses_a_graph_input_outside_the_contract(seqcls_model) -> None:
    with pytest.raises(RuntimeError, match=r"the graph takes input 'head_mask', which is not one of"):
        seqcls_model(("input_ids", "token_type_ids"), extra_input="head_mask")


def test_per_text_runs_rows_at_their_mask_length(seqcls_model) -> None:
    """The mask, not the pad id, decides a row's length when the graph takes one (here pads are id 4)."""
    model, _ = seqcls_model(("input_ids", "attention_mask"), batching="per-text")
    seen = []
    session = model.session

    class Spy:
        def run(self, outputs, feed):
            seen.append(feed["input_ids"].shape)
            return session.run(outputs, feed)

    model.session = Spy()
    ids = np.array([[1, 5, 2, 4, 4], [1, 6, 7, 8, 2], [1, 9, 2, 4, 4]])
    attention = (np.arange(5) < np.array([[3], [5], [3]])).astype(np.int64)
    out = model.execute([_req(ids, attention_mask=attention), _req([[1, 3, 2]], attention_mask=[[1, 1, 1]])])
    assert sorted(seen) == [(1, 5), (3, 3)]  # rows of length 3 from both requests share one run
    model.session = session
    padded = model.execute([_req(ids, attention_mask=attention)])  # per-text again, but check vs the padded run
    model.batching = "per-request"
    reference = model.execute([_req(ids, attention_mask=attention)])[0].outputs["logits"]
    np.testing.assert_allclose(out[0].outputs["logits"], reference, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(padded[0].outputs["logits"], reference, rtol=1e-5, atol=1e-6)
