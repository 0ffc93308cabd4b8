"""One bad request fails only itself: the Triton python models' ``execute`` without a Triton.

Each shipped ``model.py`` is copied into a version directory beside the modules it imports (as
publish does) and driven with a stand-in for ``triton_python_backend_utils``: a dynamic batch
mixing good requests with hostile ones must answer the good ones exactly as when they come alone
and give each hostile one its own ``INVALID_ARG`` error. The real server is exercised by
``tests/test_serving_fuzz.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from seqcls.errors import InputError
from seqcls_tools.fake_pb_utils import Logger, Tensor
from tests.helpers.serving import LABELS, MAX_POSITIONS, TYPE_VOCAB, VOCAB, ids_request, load, model_config, outcome

__all__ = ["load"]  # the fixture, imported for this module's tests


def _texts(*items: object) -> dict[str, Tensor]:
    return {"TEXT": Tensor("TEXT", np.array([[x] for x in items], dtype=object).reshape(len(items), 1))}


def test_tokenizer_answers_the_good_requests_of_a_hostile_batch(load) -> None:
    model = load("tokenizer", max_text_bytes=64)
    batch = [
        _texts("公司宣布裁员".encode()),
        _texts(b"ok", b"\xff\xfe"),  # invalid UTF-8
        _texts(b"a" * 65),  # over max_text_bytes: refused, not truncated
        {"TEXT": Tensor("TEXT", np.zeros((1, 1), dtype=np.float32))},  # not BYTES
        {},  # no TEXT at all
        _texts(),  # no texts: a defined empty answer
        _texts(b"\x00\x00", "\x01\u200b\t\n".encode(), b""),  # only NUL / control / nothing: [CLS] [SEP]
        _texts(b"a" * 64, b"ab!"),  # exactly the limit is fine
        _texts(np.int64(3)),  # not bytes (bytes(3) would be three NULs)
    ]
    responses = model.execute(batch)
    assert len(responses) == len(batch)
    assert "not valid UTF-8" in outcome(responses, 1)
    assert "text 0 is 65 bytes, over the limit of 64 bytes (max_text_bytes)" in outcome(responses, 2)
    assert "must be BYTES" in outcome(responses, 3)
    assert "no TEXT input" in outcome(responses, 4)
    assert "not bytes" in outcome(responses, 8)
    for good in (0, 5, 6, 7):
        assert outcome(responses, good) is None
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
    assert "over the limit of 65536 bytes" in outcome(responses, 0)
    assert outcome(responses, 1) and outcome(responses, 2) is None


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
    assert "tokenization failed (RuntimeError: boom)" in outcome(responses, 1)
    assert outcome(responses, 0) is None and outcome(responses, 2) is None
    assert responses[2].outputs["input_ids"].tolist() == [[1, 11, 13, 2]]
    assert any("retrying request by request" in e for e in Logger.errors)


@pytest.mark.parametrize("batching", ["per-request", "group-by-length", "pad-to-longest"])
def test_model_refuses_what_the_embeddings_cannot_index_per_request(load, batching: str) -> None:
    model = load("seqcls_model", config=model_config(batching=batching))
    vocab = len(VOCAB)
    assert (model.vocab_size, model.type_vocab_size, model.max_positions) == (vocab, TYPE_VOCAB, MAX_POSITIONS)
    batch = [
        ids_request([[1, 5, 6, 2]]),
        ids_request([[1, vocab, 2]]),  # id == vocabulary size
        ids_request([[1, -1, 2]]),  # negative: ORT would wrap it around
        ids_request([[1, 5, 2]], [[0, TYPE_VOCAB, 0]]),  # token type out of range
        ids_request([[1] * (MAX_POSITIONS + 1)]),  # longer than max_position_embeddings
        ids_request([[1, 5, 2]], [[0, 0]]),  # shapes differ
        ids_request([[1.0, 5.0, 2.0]], dtype=np.float32),
        ids_request(np.zeros((0, 3))),  # no rows: empty logits
        ids_request(np.zeros((1, 0))),  # a row without tokens
        {"input_ids": Tensor("input_ids", np.ones((1, 2), dtype=np.int64))},  # token_type_ids missing
        ids_request([[1, 7, 8, 9, 2], [1, 5, 2, 0, 0]]),
        ids_request([[1] * MAX_POSITIONS]),  # exactly max_position_embeddings is fine
    ]
    responses = model.execute(batch)
    assert len(responses) == len(batch)
    assert f"input_ids must lie in [0, {vocab}), got values from 1 to {vocab}" in outcome(responses, 1)
    assert "got values from -1" in outcome(responses, 2)
    assert f"token_type_ids must lie in [0, {TYPE_VOCAB})" in outcome(responses, 3)
    assert f"sequence length {MAX_POSITIONS + 1} is over the model's max_position_embeddings" in outcome(responses, 4)
    assert "of the same shape" in outcome(responses, 5)
    assert "must be integers" in outcome(responses, 6)
    assert "sequence length 0" in outcome(responses, 8)
    assert "needs both input_ids and token_type_ids" in outcome(responses, 9)
    assert responses[7].outputs["logits"].shape == (0, len(LABELS))
    for good in (0, 10, 11):
        assert outcome(responses, good) is None
        alone = model.execute([batch[good]])[0].outputs["logits"]
        np.testing.assert_allclose(responses[good].outputs["logits"], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batching", ["per-request", "pad-to-longest"])
def test_model_ort_failure_in_a_shared_run_fails_only_the_culprit(load, batching: str) -> None:
    model = load("seqcls_model", config=model_config(batching=batching))
    session = model.session

    class Picky:
        def run(self, outputs, feeds):
            if (feeds["input_ids"] == 14).any():
                raise RuntimeError("indices element out of data bounds")
            return session.run(outputs, feeds)

    model.session = Picky()
    responses = model.execute([ids_request([[1, 5, 2]]), ids_request([[1, 14, 2]]), ids_request([[1, 6, 7, 2]])])
    assert "ONNX Runtime failed on this request (RuntimeError: indices element" in outcome(responses, 1)
    assert outcome(responses, 0) is None and outcome(responses, 2) is None
    assert responses[2].outputs["logits"].shape == (1, len(LABELS))


def test_model_limits_fall_back_to_release_json(load, monkeypatch: pytest.MonkeyPatch) -> None:
    model = load("seqcls_model")
    monkeypatch.setitem(sys.modules, "onnx", None)  # no onnx in the stub's environment: import fails
    model._limits(str(model.test_version_dir / "model.onnx"), str(model.test_version_dir / "release.json"))
    assert (model.vocab_size, model.max_positions, model.num_labels) == (None, 8, len(LABELS))  # max_length
    responses = model.execute([ids_request([[1] * 9]), ids_request([[1, 99, 2]])])
    assert "sequence length 9 is over" in outcome(responses, 0)
    assert "ONNX Runtime failed on this request" in outcome(responses, 1)  # ORT's own check, caught


def test_postprocess_answers_the_good_requests_of_a_hostile_batch(load) -> None:
    model = load("seqcls_postprocess")
    c = len(LABELS)
    good = np.array([[5.0, 5.0, -5.0]], dtype=np.float32)
    batch = [
        {"logits": Tensor("logits", good)},
        {"logits": Tensor("logits", np.zeros((1, c + 1), dtype=np.float32))},
        {"logits": Tensor("logits", np.zeros(c, dtype=np.float32))},
        {},
        {"logits": Tensor("logits", np.zeros((0, c), dtype=np.float32))},
        {"logits": Tensor("logits", np.array([[np.nan, np.inf, -np.inf]], dtype=np.float32))},
    ]
    responses = model.execute(batch)
    assert f"expected [N, {c}]" in outcome(responses, 1) and f"expected [N, {c}]" in outcome(responses, 2)
    assert "no logits input" in outcome(responses, 3)
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
    assert "not valid UTF-8" in outcome(responses, 1)
    assert "over the limit of 16 bytes" in outcome(responses, 2)
    assert "RuntimeError: boom" in outcome(responses, 3)
    assert responses[4].outputs["input_ids"].shape == (0, 2)
    assert responses[5].outputs["input_ids"].tolist() == [[1, 5, 6, 7, 2]]


def test_decode_utf8_limits_and_non_text_items() -> None:
    from seqcls.contract import shipped

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
            checkpoint=SimpleNamespace(
                max_position_embeddings=160, origin=tmp_path, config_file=tmp_path / "model_config.json"
            ),
        )

    check_max_length(release(160))  # equal is fine: positions 0..159
    with pytest.raises(
        InputError, match=r"max_length=161 is larger than the checkpoint's max_position_embeddings=160"
    ) as err:
        check_max_length(release(161))
    assert f"({tmp_path / 'model_config.json'})" in str(err.value)  # the config file the checkpoint came with
