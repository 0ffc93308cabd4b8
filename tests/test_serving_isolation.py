"""One bad request fails only itself: the Triton python models' ``execute`` without a Triton.

Each shipped ``model.py`` is copied into a version directory beside the modules it imports (as
publish does) and driven with a stand-in for ``triton_python_backend_utils``: a dynamic batch
mixing good requests with hostile ones must answer the good ones exactly as when they come alone
and give each hostile one its own ``INVALID_ARG`` error. The real server is exercised by
``tests/test_serving_fuzz.py``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import ClassVar

import numpy as np
import pytest

from seqcls.errors import InputError
from seqcls.settings import PROJECT_ROOT

SOURCE = PROJECT_ROOT / "model_repository"
VOCAB = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]", "公", "司", "宣", "布", "裁", "员", "a", "b", "##b", "!"]
LABELS = ["体育", "体育##夺冠", "财经"]
MAX_POSITIONS = 16
TYPE_VOCAB = 4


class _Error:
    INVALID_ARG = "INVALID_ARG"

    def __init__(self, message: str, code: object = None) -> None:
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> object:
        return self._code


class _Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        assert isinstance(array, np.ndarray), f"{name}: {type(array)}"
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class _Response:
    def __init__(self, output_tensors: list[_Tensor] | None = None, error: _Error | None = None) -> None:
        self.outputs = {t.name(): t.as_numpy() for t in output_tensors or []}
        self.error = error


class _Logger:
    errors: ClassVar[list[str]] = []

    @classmethod
    def log_error(cls, message: str) -> None:
        cls.errors.append(message)


def _fake_pb_utils() -> ModuleType:
    mod = ModuleType("triton_python_backend_utils")
    mod.TritonError = _Error  # type: ignore[attr-defined]
    mod.Tensor = _Tensor  # type: ignore[attr-defined]
    mod.InferenceResponse = _Response  # type: ignore[attr-defined]
    mod.TritonModelException = RuntimeError  # type: ignore[attr-defined]
    mod.Logger = _Logger  # type: ignore[attr-defined]
    mod.get_input_tensor_by_name = lambda request, name: request.get(name)  # type: ignore[attr-defined]
    return mod


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


def _config(**params: str) -> str:
    return json.dumps({"parameters": {k: {"string_value": v} for k, v in params.items()}})


@pytest.fixture
def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``load(role, source, **release)`` → an initialized TritonPythonModel from a fresh version dir."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("seqcls_text", "seqcls_decide", "seqcls_backend"):  # the copies beside model.py
        monkeypatch.delitem(sys.modules, name, raising=False)
    _Logger.errors = []

    def _load(role: str, source: str = "model.py", config: str = "{}", **release: object):
        version = tmp_path / role / "1"
        version.mkdir(parents=True)
        shutil.copy(SOURCE / role / source, version / "model.py")
        for common in ("seqcls_contract", "seqcls_text", "seqcls_decide", "seqcls_backend"):
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


def _texts(*items: object) -> dict[str, _Tensor]:
    return {"TEXT": _Tensor("TEXT", np.array([[x] for x in items], dtype=object).reshape(len(items), 1))}


def _ids(ids: object, types: object | None = None, dtype: object = np.int64) -> dict[str, _Tensor]:
    a = np.asarray(ids, dtype=dtype)
    b = np.zeros_like(a) if types is None else np.asarray(types, dtype=dtype)
    return {"input_ids": _Tensor("input_ids", a), "token_type_ids": _Tensor("token_type_ids", b)}


def _outcome(responses: list[_Response], i: int) -> str | None:
    err = responses[i].error
    if err is None:
        return None
    assert err.code() == "INVALID_ARG", err.message()
    return err.message()


def test_tokenizer_answers_the_good_requests_of_a_hostile_batch(load) -> None:
    model = load("tokenizer", max_text_bytes=64)
    batch = [
        _texts("公司宣布裁员".encode()),
        _texts(b"ok", b"\xff\xfe"),  # invalid UTF-8
        _texts(b"a" * 65),  # over max_text_bytes: refused, not truncated
        {"TEXT": _Tensor("TEXT", np.zeros((1, 1), dtype=np.float32))},  # not BYTES
        {},  # no TEXT at all
        _texts(),  # no texts: a defined empty answer
        _texts(b"\x00\x00", "\x01\u200b\t\n".encode(), b""),  # only NUL / control / nothing: [CLS] [SEP]
        _texts(b"a" * 64, b"ab!"),  # exactly the limit is fine
        _texts(np.int64(3)),  # not bytes (bytes(3) would be three NULs)
    ]
    responses = model.execute(batch)
    assert len(responses) == len(batch)
    assert "not valid UTF-8" in _outcome(responses, 1)
    assert "text 0 is 65 bytes, over the limit of 64 bytes (max_text_bytes)" in _outcome(responses, 2)
    assert "must be BYTES" in _outcome(responses, 3)
    assert "no TEXT input" in _outcome(responses, 4)
    assert "not bytes" in _outcome(responses, 8)
    for good in (0, 5, 6, 7):
        assert _outcome(responses, good) is None
        alone = model.execute([batch[good]])[0]
        for name in ("input_ids", "token_type_ids"):
            np.testing.assert_array_equal(responses[good].outputs[name], alone.outputs[name])
    assert responses[0].outputs["input_ids"].tolist() == [[1, 5, 6, 7, 8, 9, 10, 2]]
    assert responses[5].outputs["input_ids"].shape == (0, 2)
    assert responses[6].outputs["input_ids"].tolist() == [[1, 2], [1, 2], [1, 2]]


def test_tokenizer_default_text_limit_is_the_contract_s(load) -> None:
    model = load("tokenizer")
    contract = sys.modules["seqcls_contract"]
    assert model.max_text_bytes == contract.MAX_TEXT_BYTES == 64 * 1024
    responses = model.execute([_texts(b"a" * (64 * 1024 + 1)), _texts("a" * 100_000 + "\ud800"), _texts(b"a")])
    assert "over the limit of 65536 bytes" in _outcome(responses, 0)
    assert _outcome(responses, 1) and _outcome(responses, 2) is None


def test_tokenizer_exception_in_one_request_fails_only_it(load) -> None:
    model = load("tokenizer")
    real = model.tokenizer

    class Exploding:
        def encode_batch(self, texts):
            if any("b!" in t for t in texts):
                raise RuntimeError("boom")
            return real.encode_batch(texts)

    model.tokenizer = Exploding()
    responses = model.execute([_texts(b"a"), _texts(b"b!"), _texts(b"ab")])
    assert "tokenization failed (RuntimeError: boom)" in _outcome(responses, 1)
    assert _outcome(responses, 0) is None and _outcome(responses, 2) is None
    assert responses[2].outputs["input_ids"].tolist() == [[1, 11, 13, 2]]
    assert any("retrying request by request" in e for e in _Logger.errors)


@pytest.mark.parametrize("batching", ["per-request", "group-by-length", "pad-to-longest"])
def test_model_refuses_what_the_embeddings_cannot_index_per_request(load, batching: str) -> None:
    model = load("seqcls_model", config=_config(batching=batching))
    vocab = len(VOCAB)
    assert (model.vocab_size, model.type_vocab_size, model.max_positions) == (vocab, TYPE_VOCAB, MAX_POSITIONS)
    batch = [
        _ids([[1, 5, 6, 2]]),
        _ids([[1, vocab, 2]]),  # id == vocabulary size
        _ids([[1, -1, 2]]),  # negative: ORT would wrap it around
        _ids([[1, 5, 2]], [[0, TYPE_VOCAB, 0]]),  # token type out of range
        _ids([[1] * (MAX_POSITIONS + 1)]),  # longer than max_position_embeddings
        _ids([[1, 5, 2]], [[0, 0]]),  # shapes differ
        _ids([[1.0, 5.0, 2.0]], dtype=np.float32),
        _ids(np.zeros((0, 3))),  # no rows: empty logits
        _ids(np.zeros((1, 0))),  # a row without tokens
        {"input_ids": _Tensor("input_ids", np.ones((1, 2), dtype=np.int64))},  # token_type_ids missing
        _ids([[1, 7, 8, 9, 2], [1, 5, 2, 0, 0]]),
        _ids([[1] * MAX_POSITIONS]),  # exactly max_position_embeddings is fine
    ]
    responses = model.execute(batch)
    assert len(responses) == len(batch)
    assert f"input_ids must lie in [0, {vocab}), got values from 1 to {vocab}" in _outcome(responses, 1)
    assert "got values from -1" in _outcome(responses, 2)
    assert f"token_type_ids must lie in [0, {TYPE_VOCAB})" in _outcome(responses, 3)
    assert f"sequence length {MAX_POSITIONS + 1} is over the model's max_position_embeddings" in _outcome(responses, 4)
    assert "of the same shape" in _outcome(responses, 5)
    assert "must be integers" in _outcome(responses, 6)
    assert "sequence length 0" in _outcome(responses, 8)
    assert "needs both input_ids and token_type_ids" in _outcome(responses, 9)
    assert responses[7].outputs["logits"].shape == (0, len(LABELS))
    for good in (0, 10, 11):
        assert _outcome(responses, good) is None
        alone = model.execute([batch[good]])[0].outputs["logits"]
        np.testing.assert_allclose(responses[good].outputs["logits"], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batching", ["per-request", "pad-to-longest"])
def test_model_ort_failure_in_a_shared_run_fails_only_the_culprit(load, batching: str) -> None:
    model = load("seqcls_model", config=_config(batching=batching))
    session = model.session

    class Picky:
        def run(self, outputs, feeds):
            if (feeds["input_ids"] == 14).any():
                raise RuntimeError("indices element out of data bounds")
            return session.run(outputs, feeds)

    model.session = Picky()
    responses = model.execute([_ids([[1, 5, 2]]), _ids([[1, 14, 2]]), _ids([[1, 6, 7, 2]])])
    assert "ONNX Runtime failed on this request (RuntimeError: indices element" in _outcome(responses, 1)
    assert _outcome(responses, 0) is None and _outcome(responses, 2) is None
    assert responses[2].outputs["logits"].shape == (1, len(LABELS))


def test_model_limits_fall_back_to_release_json(load, monkeypatch: pytest.MonkeyPatch) -> None:
    model = load("seqcls_model")
    monkeypatch.setitem(sys.modules, "onnx", None)  # no onnx in the stub's environment: import fails
    model._limits(str(model.test_version_dir / "model.onnx"), str(model.test_version_dir / "release.json"))
    assert (model.vocab_size, model.max_positions, model.num_labels) == (None, 8, len(LABELS))  # max_length
    responses = model.execute([_ids([[1] * 9]), _ids([[1, 99, 2]])])
    assert "sequence length 9 is over" in _outcome(responses, 0)
    assert "ONNX Runtime failed on this request" in _outcome(responses, 1)  # ORT's own check, caught


def test_postprocess_answers_the_good_requests_of_a_hostile_batch(load) -> None:
    model = load("seqcls_postprocess")
    c = len(LABELS)
    good = np.array([[5.0, 5.0, -5.0]], dtype=np.float32)
    batch = [
        {"logits": _Tensor("logits", good)},
        {"logits": _Tensor("logits", np.zeros((1, c + 1), dtype=np.float32))},
        {"logits": _Tensor("logits", np.zeros(c, dtype=np.float32))},
        {},
        {"logits": _Tensor("logits", np.zeros((0, c), dtype=np.float32))},
        {"logits": _Tensor("logits", np.array([[np.nan, np.inf, -np.inf]], dtype=np.float32))},
    ]
    responses = model.execute(batch)
    assert f"expected [N, {c}]" in _outcome(responses, 1) and f"expected [N, {c}]" in _outcome(responses, 2)
    assert "no logits input" in _outcome(responses, 3)
    assert [json.loads(x[0])[0]["label"] for x in responses[0].outputs["predictions"]] == ["体育"]
    assert responses[4].outputs["predictions"].shape == (0, 1)
    assert [p["label"] for p in json.loads(responses[5].outputs["predictions"][0, 0])] == ["体育", "体育##夺冠"]


def test_paddlenlp_tokenizer_fails_bad_requests_alone(load) -> None:
    model = load("tokenizer", source="model_paddlenlp.py")
    model.max_length, model.max_text_bytes, model.pad_id = 8, 16, 0

    def tokenizer(texts, **_):
        if "boom" in texts:
            raise RuntimeError("boom")
        ids = [[1, *range(5, 5 + len(t)), 2] for t in texts]
        return {"input_ids": ids, "token_type_ids": [[0] * len(x) for x in ids]}

    model.tokenizer = tokenizer
    responses = model.execute(
        [_texts(b"ab"), _texts(b"\xff"), _texts(b"a" * 17), _texts(b"boom"), _texts(), _texts(b"abc")]
    )
    assert "not valid UTF-8" in _outcome(responses, 1)
    assert "over the limit of 16 bytes" in _outcome(responses, 2)
    assert "RuntimeError: boom" in _outcome(responses, 3)
    assert responses[4].outputs["input_ids"].shape == (0, 2)
    assert responses[5].outputs["input_ids"].tolist() == [[1, 5, 6, 7, 2]]


def test_decode_utf8_limits_and_non_text_items() -> None:
    from seqcls.serving import shipped

    texts, errors = shipped.text().decode_utf8([b"abc", b"abcd", "\ud800", 5, "ab"], max_bytes=3)
    assert texts == ["abc", "", "", "", "ab"]
    assert errors[0] is None and errors[4] is None
    assert "text 1 is 4 bytes, over the limit of 3 bytes" in errors[1]
    assert "not valid Unicode" in errors[2] and "int, not bytes" in errors[3]


def test_validate_refuses_max_length_over_max_position_embeddings(tmp_path: Path) -> None:
    from seqcls.steps.validate import check_max_length

    def release(max_length: int) -> SimpleNamespace:
        return SimpleNamespace(
            config=SimpleNamespace(max_length=max_length),
            checkpoint=SimpleNamespace(max_position_embeddings=160, path=tmp_path),
        )

    check_max_length(release(160))  # equal is fine: positions 0..159
    with pytest.raises(InputError, match=r"max_length=161 is larger than the checkpoint's max_position_embeddings=160"):
        check_max_length(release(161))
