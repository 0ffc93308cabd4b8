"""``per-text`` batching: every text runs unpadded, and answers as the padded run does.

On a real tiny ERNIE (built, exported and converted by the release path's own functions) every
strategy's logits for a dynamic batch of mixed requests must match ``per-request`` (each request
padded to its longest) within the parity gate's tolerance; one bad request — or one text whose
ORT run fails — must still fail only its own request. Speed is measured by
``tools/seqcls_tools/bench/per_text.py``, not here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from seqcls.config import ReleaseConfig
from tests.helpers.serving import LABELS, MAX_POSITIONS, TYPE_VOCAB, VOCAB, ids_request, load, model_config, outcome

__all__ = ["load"]  # the fixture, imported for this module's tests


@pytest.fixture(scope="module")
def tiny_onnx(tiny_checkpoint_src: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from seqcls_tools.bench.per_text import to_onnx

    return to_onnx(tiny_checkpoint_src, tmp_path_factory.mktemp("per-text-onnx"))


@pytest.fixture
def real_model(tiny_onnx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from seqcls_tools.bench.per_text import load_model
    from seqcls_tools.fake_pb_utils import fake_pb_utils

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_pb_utils())
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "seqcls_backend", raising=False)

    def _load(batching: str, grouped: bool = True):
        model = load_model(tiny_onnx, tmp_path, batching=batching, threads=1)
        model.group_equal_lengths = grouped
        return model

    yield _load
    sys.modules.pop("seqcls_backend", None)


@pytest.mark.slow
def test_every_batching_matches_the_padded_run_on_a_real_ernie(tiny_checkpoint_src: Path, real_model) -> None:
    from seqcls.contract import shipped
    from seqcls_tools.bench.per_text import logits_of
    from seqcls_tools.fake_pb_utils import request
    from seqcls_tools.testing import TINY_CORPUS

    text = shipped.text()
    tok = text.build_tokenizer(tiny_checkpoint_src / "vocab.txt", lowercase=True, max_length=64)
    texts = [*TINY_CORPUS, "", "裁员", "夺冠 夺冠 夺冠 夺冠 夺冠 夺冠 夺冠 夺冠 夺冠 夺冠 夺冠 夺冠 夺冠 夺冠"]
    ids = text.encode(tok, texts)
    assert len({len(x) for x in ids}) > 3 and min(len(x) for x in ids) == 2  # "" is [CLS] [SEP]
    sizes, start, batch = [8, 1, 3, 8, 1, 5], 0, []
    for n in sizes:  # requests of 8, 1, 3… texts, each padded to its own longest, wrapping round the texts
        rows = [ids[(start + k) % len(ids)] for k in range(n)]
        start += n
        a, t = text.pad(rows, strategy="longest")
        batch.append(request(input_ids=a, token_type_ids=t))
    gate = ReleaseConfig()
    reference = [logits_of(r) for r in real_model("per-request").execute(batch)]
    labels = (tiny_checkpoint_src / "label.txt").read_text(encoding="utf-8").split()
    assert [r.shape for r in reference] == [(n, len(labels)) for n in sizes]
    deltas = {}
    for batching, grouped in [
        ("group-by-length", True),
        ("pad-to-longest", True),
        ("per-text", True),
        ("per-text", False),
    ]:
        got = [logits_of(r) for r in real_model(batching, grouped).execute(batch)]
        for g, ref in zip(got, reference, strict=True):
            np.testing.assert_allclose(g, ref, atol=gate.atol, rtol=gate.rtol)
        deltas[batching, grouped] = max(float(np.abs(g - ref).max()) for g, ref in zip(got, reference, strict=True))
    alone = real_model("per-text").execute([batch[0]])[0]  # the dynamic batch around a request changes nothing
    np.testing.assert_allclose(logits_of(alone), reference[0], atol=gate.atol, rtol=gate.rtol)
    assert max(deltas.values()) <= gate.atol, deltas


def test_per_text_refuses_what_the_embeddings_cannot_index_per_request(load) -> None:
    model = load("seqcls_model", config=model_config(batching="per-text"))
    vocab = len(VOCAB)
    batch = [
        ids_request([[1, 5, 6, 2]]),
        ids_request([[1, vocab, 2]]),
        ids_request([[1, 5, 2]], [[0, TYPE_VOCAB, 0]]),
        ids_request([[1] * (MAX_POSITIONS + 1)]),
        ids_request([[1, 5, 2]], [[0, 0]]),
        ids_request(np.zeros((0, 3))),
        {"input_ids": ids_request([[1, 2]])["input_ids"]},
        ids_request([[1, 7, 8, 9, 2], [1, 5, 2, 0, 0], [1, 5, 6, 2, 0]]),  # 5, 3 and 4 tokens: three lengths
        ids_request([[1] * MAX_POSITIONS]),
        ids_request([[0, 0, 0]]),  # nothing but pads: run as given
    ]
    responses = model.execute(batch)
    assert f"input_ids must lie in [0, {vocab})" in outcome(responses, 1)
    assert f"token_type_ids must lie in [0, {TYPE_VOCAB})" in outcome(responses, 2)
    assert "over the model's max_position_embeddings" in outcome(responses, 3)
    assert "of the same shape" in outcome(responses, 4)
    assert responses[5].outputs["logits"].shape == (0, len(LABELS))
    assert "needs both input_ids and token_type_ids" in outcome(responses, 6)
    model.batching = "per-request"
    for good in (0, 7, 8, 9):
        assert outcome(responses, good) is None
        padded = model.execute([batch[good]])[0].outputs["logits"]
        np.testing.assert_allclose(responses[good].outputs["logits"], padded, rtol=1e-5, atol=1e-6)
    assert responses[7].outputs["logits"].shape == (3, len(LABELS))


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "one-run-per-text"])
def test_per_text_ort_failure_fails_only_the_culprit_s_request(load, grouped: bool) -> None:
    model = load("seqcls_model", config=model_config(batching="per-text"))
    model.group_equal_lengths = grouped
    session, runs = model.session, []

    class Picky:
        def run(self, outputs, feeds):
            runs.append(feeds["input_ids"].shape)
            if (feeds["input_ids"] == 14).any():
                raise RuntimeError("indices element out of data bounds")
            return session.run(outputs, feeds)

    model.session = Picky()
    batch = [
        ids_request([[1, 5, 2]]),
        ids_request([[1, 6, 2, 0], [1, 14, 2, 0], [1, 6, 7, 2]]),  # its second text breaks ORT: the request fails
        ids_request([[1, 6, 7, 2], [1, 8, 2, 0]]),  # shares both lengths with the culprit's request
    ]
    responses = model.execute(batch)
    assert "ONNX Runtime failed on this text (RuntimeError: indices element" in outcome(responses, 1)
    assert outcome(responses, 0) is None and outcome(responses, 2) is None
    assert responses[2].outputs["logits"].shape == (2, len(LABELS))
    if grouped:  # four texts of length 3 shared a run, it failed, each retried alone
        assert runs == [(4, 3), (1, 3), (1, 3), (1, 3), (1, 3), (1, 4)]  # the failed request's row of 4 not run
    else:
        assert runs == [(1, 3)] * 4 + [(1, 4)]
    model.session, model.batching = session, "per-request"
    for good in (0, 2):
        padded = model.execute([batch[good]])[0].outputs["logits"]
        np.testing.assert_allclose(responses[good].outputs["logits"], padded, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["bert", "deberta-v2"])
def test_per_text_on_real_hf_graphs_with_an_attention_mask(
    architecture: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.onnx exports of tiny HF classifiers: the graph's inputs taken as declared, the embedding
    limits found (token types and positions through torch's Slice/Cast index paths), per-text rows at
    their mask length answering as the padded run."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from seqcls_tools.bench.per_text import load_model, logits_of
    from seqcls_tools.fake_pb_utils import fake_pb_utils, request

    torch.manual_seed(0)
    common = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    common.update(max_position_embeddings=48, num_labels=5)
    if architecture == "bert":
        model = transformers.BertForSequenceClassification(transformers.BertConfig(type_vocab_size=2, **common))
        inputs = ("input_ids", "attention_mask", "token_type_ids")  # forward()'s order
    else:
        config = transformers.DebertaV2Config(
            type_vocab_size=0, relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=16, **common
        )
        model = transformers.DebertaV2ForSequenceClassification(config)
        inputs = ("input_ids", "attention_mask")
    model.eval()
    rng = np.random.default_rng(0)
    lengths = [3, 9, 2, 14, 9, 6, 14, 11]
    ids, mask = np.zeros((8, 14), np.int64), np.zeros((8, 14), np.int64)
    for r, n in enumerate(lengths):
        ids[r, :n] = [1, *rng.integers(5, 120, n - 2), 2]
        mask[r, :n] = 1
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    onnx_file = tmp_path / f"{architecture}.onnx"
    torch.onnx.export(
        model,
        tuple(torch.tensor(feeds[n]) for n in inputs),
        str(onnx_file),
        input_names=list(inputs),
        output_names=["logits"],
        dynamic_axes={n: {0: "batch", 1: "sequence"} for n in inputs},
        opset_version=17,
        dynamo=False,
    )
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_pb_utils())
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "seqcls_backend", raising=False)
    served = {b: load_model(onnx_file, tmp_path, batching=b, threads=1) for b in ("per-request", "per-text")}
    contract = sys.modules["seqcls_contract"]
    assert served["per-text"].inputs == tuple(n for n in contract.MODEL_INPUT_NAMES if n in inputs)
    limits = type(served["per-text"]).initialize.__globals__["embedding_limits"](str(onnx_file))
    assert limits == {"input_ids": 120, "positions": 48, **({"token_type_ids": 2} if architecture == "bert" else {})}
    batch = [request(**{n: feeds[n][:5] for n in inputs}), request(**{n: feeds[n][5:, :11] for n in inputs})]
    gate = ReleaseConfig()
    padded = [logits_of(r) for r in served["per-request"].execute(batch)]
    unpadded = [logits_of(r) for r in served["per-text"].execute(batch)]
    for got, ref in zip(unpadded, padded, strict=True):
        np.testing.assert_allclose(got, ref, atol=gate.atol, rtol=gate.rtol)
    hostile = request(**{**{n: feeds[n][:1] for n in inputs}, "attention_mask": np.full((1, 14), 3)})
    assert "attention_mask must be 0 or 1" in served["per-text"].execute([hostile])[0].error.message()


@pytest.mark.slow
def test_a_dynamically_quantised_graph_answers_each_text_as_alone(tiny_onnx: Path, real_model, tmp_path: Path) -> None:
    """Dynamic INT8 computes each activation's range over the whole run, so texts sharing a run move
    each other's logits: ``per-text`` must then run every row alone (the validated answers are each
    text alone), for the rows of one request and those of a dynamic batch's other requests alike."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from seqcls_tools.bench.per_text import load_model, logits_of
    from seqcls_tools.fake_pb_utils import request

    int8 = tmp_path / "int8" / "model.onnx"
    int8.parent.mkdir()
    quantize_dynamic(tiny_onnx, int8, weight_type=QuantType.QInt8)
    rng = np.random.default_rng(7)
    ids = rng.integers(5, 40, size=(6, 9))  # six texts of one length: per-text's equal-length group
    ids[:, 0], ids[:, -1] = 1, 2
    types = np.zeros_like(ids)

    def answers(model) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = [
            model.execute([request(input_ids=ids[i : i + 1], token_type_ids=types[i : i + 1])])[0] for i in range(6)
        ]
        together = model.execute([request(input_ids=ids, token_type_ids=types)])[0]
        two = [
            request(input_ids=ids[:2], token_type_ids=types[:2]),
            request(input_ids=ids[2:], token_type_ids=types[2:]),
        ]
        across = np.concatenate([logits_of(r) for r in model.execute(two)])
        return np.concatenate([logits_of(r) for r in rows]), logits_of(together), across

    alone, together, across = answers(real_model("per-text"))  # fp32: one shared run, float rounding only
    np.testing.assert_allclose(together, alone, atol=1e-5)
    np.testing.assert_allclose(across, alone, atol=1e-5)
    alone, together, across = answers(load_model(int8, tmp_path, batching="per-text", threads=1))
    assert np.array_equal(together, alone) and np.array_equal(across, alone), (
        f"int8 rows moved by their neighbours: max |Δ| {np.abs(together - alone).max():.3g} in one request, "
        f"{np.abs(across - alone).max():.3g} across requests"
    )
