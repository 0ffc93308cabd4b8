"""bf16 batch-invariant batching: a text's answer is the text in its bucket shape, and rows of one bucket
share an OpenVINO run only when no answer moves by a bit (``seqcls_engine``'s load-time self-check, the
parity gate's ``batch_invariance`` criterion).

The self-check and the gate's criterion are proven able to fail with engines whose rows depend on their
batch-mates (fakes standing in for OpenVINO's infer request); the real engine is then checked on this CPU
(skipped without AVX512-BF16 / AMX), on a tiny graph here and through a release and a real Triton in
``tests/test_bf16.py``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import seqcls_engine

from seqcls.gates import parity

HAS_BF16 = bool(set(seqcls_engine.cpu_flags()) & set(seqcls_engine.BF16_CPU_FLAGS))
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has neither avx512_bf16 nor amx_bf16")
LABELS = 3


class _Port:
    def __init__(self, name: str, type_: str = "tensor(int64)") -> None:
        self.name, self.type, self.names = name, type_, frozenset({name})


class _Request:
    """OpenVINO's infer request in miniature: each row's logits from its own ids (``coupled``: plus a term
    from the whole batch, as a run-time quantisation range would add)."""

    def __init__(self, coupled: bool) -> None:
        self.coupled, self.shapes = coupled, []
        self.weights = np.random.default_rng(0).normal(size=(200, LABELS)).astype(np.float32)

    def infer(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        ids = feed["input_ids"]
        self.shapes.append(ids.shape)
        logits = self.weights[ids].sum(axis=1) / ids.shape[1]  # depends on the padded length, as bf16 kernels do
        if self.coupled:
            logits = logits + 1e-3 * float(ids.max(initial=0)) * (ids.shape[0] > 1)
        return [logits.astype(np.float32)]


def _session(coupled: bool, batch: bool = True) -> seqcls_engine.OpenVINOSession:
    """An :class:`OpenVINOSession` on a fake infer request: its bucketing, batching and self-check as shipped."""
    s = seqcls_engine.OpenVINOSession.__new__(seqcls_engine.OpenVINOSession)
    s._inputs, s._outputs = [_Port("input_ids"), _Port("token_type_ids")], [_Port("logits", "tensor(float)")]
    s._request, s._lock, s.pad_id, s.precision = _Request(coupled), threading.Lock(), 0, "bf16"
    s.bucket_set, s.vocab = seqcls_engine.bucket_lengths(64), 200
    s.self_check = seqcls_engine.self_check(s) if batch else None
    s.batching = bool(batch and s.self_check["passed"])
    s.buckets = s.bucket_set if s.batching else ()
    s.refusal = None if s.batching else (s.self_check or {}).get("why", "batch=False")
    return s


def _feed(rows: list[list[int]]) -> dict[str, np.ndarray]:
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), np.int64)
    for k, r in enumerate(rows):
        ids[k, : len(r)] = r
    return {"input_ids": ids, "token_type_ids": np.zeros_like(ids)}


ROWS = [[1, 5, 9, 2], [1, 7, 2], [1, *range(3, 30), 2], [1, 8, 8, 8, 8, 8, 2], [1, *[4] * 50, 2]]


def test_batching_is_wanted_where_it_pays_amx_unless_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(seqcls_engine.BATCHING_ENV, raising=False)
    assert seqcls_engine.batching_wanted(frozenset({"avx512_bf16", "amx_bf16"})) == (True, None)
    wanted, why = seqcls_engine.batching_wanted(frozenset({"avx512_bf16"}))
    assert not wanted and "amx_bf16" in why and "SEQCLS_BF16_BATCHING=on" in why
    monkeypatch.setenv(seqcls_engine.BATCHING_ENV, "on")
    assert seqcls_engine.batching_wanted(frozenset({"avx512_bf16"})) == (True, None)
    monkeypatch.setenv(seqcls_engine.BATCHING_ENV, "off")
    assert seqcls_engine.batching_wanted(frozenset({"amx_bf16"})) == (False, "SEQCLS_BF16_BATCHING=off")
    monkeypatch.setenv(seqcls_engine.BATCHING_ENV, "sometimes")
    with pytest.raises(ValueError, match="SEQCLS_BF16_BATCHING='sometimes'; expected auto, on or off"):
        seqcls_engine.batching_wanted()


def test_buckets_stop_at_the_graphs_positions() -> None:
    assert seqcls_engine.bucket_lengths(None) == seqcls_engine.BUCKETS == (16, 32, 64, 128)
    assert seqcls_engine.bucket_lengths(2048) == (16, 32, 64, 128)
    assert seqcls_engine.bucket_lengths(100) == (16, 32, 64, 100)
    assert seqcls_engine.bucket_lengths(16) == (16,)


def test_the_self_check_accepts_a_batch_invariant_engine_and_rows_share_runs_in_bucket_shapes() -> None:
    s = _session(coupled=False)
    assert s.batching and s.refusal is None
    assert s.self_check["passed"] and s.self_check["rows_compared"] > 0 and s.self_check["rows_differing"] == 0
    s._request.shapes.clear()
    (together,) = s.run(["logits"], _feed(ROWS))
    shapes = s._request.shapes[:]
    alone = np.concatenate([s.run(["logits"], _feed([r]))[0] for r in ROWS])
    assert np.array_equal(together, alone)
    # rows 0, 1, 3 share bucket 16 (one run, batch padded to 4); row 2 (29 tokens) bucket 32; row 4 bucket 64
    assert sorted(shapes) == [(1, 32), (1, 64), (4, 16)]


def test_the_self_check_refuses_an_engine_whose_rows_depend_on_their_batch_mates() -> None:
    s = _session(coupled=True)
    assert not s.batching
    assert not s.self_check["passed"] and s.self_check["rows_differing"] > 0
    assert "instead of alone" in s.refusal and "bucket 16" in s.refusal
    s._request.shapes.clear()
    (together,) = s.run(["logits"], _feed(ROWS))
    assert sorted(s._request.shapes) == sorted((1, len(r)) for r in ROWS)  # alone, each at its own length
    alone = np.concatenate([s.run(["logits"], _feed([r]))[0] for r in ROWS])
    assert np.array_equal(together, alone)


def test_a_text_is_answered_in_its_bucket_shape_whatever_the_requests_padding() -> None:
    s = _session(coupled=False)
    padded = _feed([ROWS[0]])
    wide = {n: np.pad(x, ((0, 0), (0, 20))) for n, x in padded.items()}  # a request padded to its longest
    assert np.array_equal(s.run(None, padded)[0], s.run(None, wide)[0])


def test_the_gate_criterion_passes_only_bit_identical_rows() -> None:
    texts = [f"t{i}" for i in range(6)]
    alone = np.arange(18, dtype=np.float32).reshape(6, 3)
    ok = parity.batch_invariance(texts, alone, lambda m: alone[m])
    assert ok["passed"] and ok["rows_compared"] > 0 and ok["rows_differing"] == 0 and ok["first_difference"] is None
    moved = parity.batch_invariance(texts, alone, lambda m: alone[m] + np.float32(1e-6) * (len(m) > 3))
    assert not moved["passed"] and moved["rows_differing"] > 0
    assert moved["first_difference"]["batch"] > 3 and moved["max_abs_diff"] > 0
    assert not parity.batch_invariance(texts[:1], alone[:1], lambda m: alone[m])["passed"]  # nothing compared


def _tiny_graph(path: Path, vocab: int = 200, hidden: int = 64, positions: int = 48) -> None:
    """Embeddings + a hidden MatMul (bf16 kernels) + masked mean + classifier; pad id 0 masked in-graph."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n)
             for n, s in (("word", (vocab, hidden)), ("types", (4, hidden)), ("positions", (positions, hidden)),
                          ("w1", (hidden, hidden)), ("w2", (hidden, LABELS)))]  # fmt: skip
    inits += [numpy_helper.from_array(np.array(v, dtype=np.int64), n)
              for n, v in (("zero", 0), ("one", 1), ("axis1", [1]), ("axis2", [2]))]  # fmt: skip
    nodes = [
        helper.make_node("Gather", ["word", "input_ids"], ["w"]),
        helper.make_node("Gather", ["types", "token_type_ids"], ["t"]),
        helper.make_node("Shape", ["input_ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["length"]),
        helper.make_node("Range", ["zero", "length", "one"], ["position_ids"]),
        helper.make_node("Gather", ["positions", "position_ids"], ["p"]),
        helper.make_node("Add", ["w", "t"], ["wt"]),
        helper.make_node("Add", ["wt", "p"], ["x"]),
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Tanh", ["h0"], ["h"]),
        helper.make_node("Equal", ["input_ids", "zero"], ["is_pad"]),
        helper.make_node("Not", ["is_pad"], ["is_token"]),
        helper.make_node("Cast", ["is_token"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["h", "mask3"], ["hm"]),
        helper.make_node("ReduceSum", ["hm", "axis1"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["mask", "axis1"], ["count"], keepdims=1),
        helper.make_node("Div", ["total", "count"], ["mean"]),
        helper.make_node("MatMul", ["mean", "w2"], ["logits"]),
    ]
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["N", "L"]) for n in ("input_ids", "token_type_ids")]
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", LABELS])
    graph = helper.make_graph(nodes, "tiny", ids, [out], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), str(path))


@needs_bf16
def test_openvino_bf16_on_this_cpu_is_batch_invariant_in_bucket_shapes(tmp_path: Path) -> None:
    _tiny_graph(tmp_path / "model.onnx")
    s = seqcls_engine.session(tmp_path / "model.onnx", "bf16", threads=1, batch=True)
    assert s.buckets == (16, 32, 48) and s.vocab == 200  # capped by the graph's 48-row position table
    assert s.self_check["passed"] and s.batching, s.self_check
    rng = np.random.default_rng(0)
    texts = [[1, *rng.integers(3, 200, size=int(n)).tolist(), 2] for n in rng.integers(1, 45, size=24)]
    alone = np.concatenate([s.run(["logits"], _feed([t]))[0] for t in texts])
    for _ in range(10):
        members = list(rng.permutation(len(texts))[: int(rng.integers(2, 12))])
        (got,) = s.run(["logits"], _feed([texts[i] for i in members]))
        assert np.array_equal(got, alone[members])
    unbatched = seqcls_engine.session(tmp_path / "model.onnx", "bf16", threads=1, batch=False)
    assert not unbatched.batching and unbatched.self_check is None and unbatched.buckets == ()
    own = np.concatenate([unbatched.run(["logits"], _feed([t]))[0] for t in texts])  # each at its own length
    assert np.array_equal(unbatched.run(["logits"], _feed(texts))[0], own)


def test_profile_timing_hands_a_batching_engine_each_batch_in_one_call() -> None:
    from seqcls.profiles.timing import runs_at

    feeds = [{"input_ids": np.ones((1, n), np.int64)} for n in (3, 5, 3, 7)]
    runs = runs_at(feeds, 2, merge=False, any_length=True)
    assert [r["input_ids"].shape for r in runs] == [(2, 5), (2, 7)]
    assert runs[0]["input_ids"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert len(runs_at(feeds, 2, merge=False)) == 4  # refused batching: each text alone
