"""The shipped Triton python models driven without a Triton: each ``model.py`` copied into a fresh
version directory beside the modules it imports (as publish lays it out), a tiny vocabulary, labels and
ONNX model, and :mod:`seqcls_tools.fake_pb_utils` standing in for ``triton_python_backend_utils``."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from seqcls.settings import PROJECT_ROOT
from seqcls_tools.fake_pb_utils import InferenceResponse, Logger, Tensor, fake_pb_utils

SOURCE = PROJECT_ROOT / "model_repository"
VOCAB = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]", "公", "司", "宣", "布", "裁", "员", "a", "b", "##b", "!"]
LABELS = ["体育", "体育##夺冠", "财经"]
MAX_POSITIONS = 16
TYPE_VOCAB = 4


def _tiny_onnx(path: Path, vocab: int, hidden: int = 8) -> None:
    """ERNIE's embedding shape in miniature: word + type + position tables (``Gather``s), mean, linear."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Gather", ["word", "input_ids"], ["w"]),
        helper.make_node("Gather", ["types", "token_type_ids"], ["t"]),
        helper.make_node("Shape", ["input_ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["length"]),
        helper.make_node("Range", ["zero", "length", "one"], ["positions_ids"]),
        helper.make_node("Gather", ["positions", "positions_ids"], ["p"]),
        helper.make_node("Add", ["w", "t"], ["wt"]),
        helper.make_node("Add", ["wt", "p"], ["x"]),
        helper.make_node("Equal", ["input_ids", "zero"], ["is_pad"]),  # mean over real tokens: pad-invariant
        helper.make_node("Not", ["is_pad"], ["is_token"]),
        helper.make_node("Cast", ["is_token"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["x", "mask3"], ["xm"]),
        helper.make_node("ReduceSum", ["xm", "axis1"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["mask", "axis1"], ["count"], keepdims=1),
        helper.make_node("Div", ["total", "count"], ["mean"]),
        helper.make_node("MatMul", ["mean", "classifier"], ["logits"]),
    ]
    inits = [
        init("word", vocab, hidden),
        init("types", TYPE_VOCAB, hidden),
        init("positions", MAX_POSITIONS, hidden),
        init("classifier", hidden, len(LABELS)),
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
    ]
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["N", "L"]) for n in ("input_ids", "token_type_ids")]
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", len(LABELS)])
    graph = helper.make_graph(nodes, "tiny", ids, [out], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), str(path))


def model_config(**params: str) -> str:
    """A Triton model config (JSON) with these string parameters, as ``initialize`` receives it."""
    return json.dumps({"parameters": {k: {"string_value": v} for k, v in params.items()}})


def ids_request(ids: object, types: object | None = None, dtype: object = np.int64) -> dict[str, Tensor]:
    """A ``seqcls_model`` request: ``input_ids`` and ``token_type_ids`` (zeros unless given)."""
    a = np.asarray(ids, dtype=dtype)
    b = np.zeros_like(a) if types is None else np.asarray(types, dtype=dtype)
    return {"input_ids": Tensor("input_ids", a), "token_type_ids": Tensor("token_type_ids", b)}


def outcome(responses: list[InferenceResponse], i: int) -> str | None:
    """Response ``i``'s error message (an ``INVALID_ARG`` one), None if it answered."""
    err = responses[i].error
    if err is None:
        return None
    assert err.code() == "INVALID_ARG", err.message()
    return err.message()


@pytest.fixture
def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``load(role, source, **release)`` → an initialized TritonPythonModel from a fresh version dir."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_pb_utils())
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("seqcls_text", "seqcls_decide", "seqcls_backend", "seqcls_engine"):  # the copies beside model.py
        monkeypatch.delitem(sys.modules, name, raising=False)
    Logger.errors = []

    def _load(role: str, source: str = "model.py", config: str = "{}", **release: object):
        version = tmp_path / role / "1"
        version.mkdir(parents=True)
        shutil.copy(SOURCE / role / source, version / "model.py")
        for common in ("seqcls_contract", "seqcls_text", "seqcls_decide", "seqcls_backend", "seqcls_engine"):
            shutil.copy(SOURCE / "common" / f"{common}.py", version / f"{common}.py")
        (version / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
        info = {"labels": LABELS, "thresholds": [0.5] * len(LABELS), "max_length": 8, "pad_id": 0, **release}
        (version / "release.json").write_text(json.dumps(info), encoding="utf-8")
        if role == "seqcls_model":
            _tiny_onnx(version / "model.onnx", len(VOCAB))
        spec = importlib.util.spec_from_file_location(f"_isolation_{role}_{source[:-3]}", version / "model.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        model = module.TritonPythonModel()
        model.test_version_dir = version
        if source == "model.py":
            model.initialize({"model_config": config, "model_repository": str(tmp_path / role), "model_version": "1"})
        return model

    yield _load
    for name in ("seqcls_text", "seqcls_decide", "seqcls_backend"):
        sys.modules.pop(name, None)
