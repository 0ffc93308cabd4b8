"""The serving models' seqcls_* metrics without a Triton: what each ``execute`` exports, the
per-label series bound, and that metrics never fail a request (real server: test_monitoring_serving.py)."""

from __future__ import annotations

import json
import sys
from collections import Counter

import numpy as np
import pytest

from seqcls.monitoring import reference
from seqcls_tools.fake_pb_utils import Logger, MetricFamily, Tensor
from tests.helpers.serving import LABELS, load, model_config, outcome

__all__ = ["load"]


def series(name: str, **labels: str) -> dict[tuple, object]:
    return {
        k: v for k, v in MetricFamily.series.items() if k[0] == name and all((a, b) in k[1] for a, b in labels.items())
    }


def total(name: str, **labels: str) -> float:
    return sum(v for v in series(name, **labels).values())  # type: ignore[misc]


def test_postprocess_counts_what_it_answers(load) -> None:
    model = load("seqcls_postprocess", model_name="alpha")
    c = sys.modules["seqcls_contract"]
    logits = np.array([[5.0, 5.0, -5.0], [-5.0, -5.0, -5.0], [5.0, -5.0, 0.1]], dtype=np.float32)
    responses = model.execute([{"logits": Tensor("logits", logits)}, {}, {"logits": Tensor("logits", logits[:1])}])
    assert total(c.METRIC_TEXTS) == 0  # execute only adds to local sums; the flusher hands them to Triton
    model.metrics.flush()
    answers = [json.loads(x[0]) for r in (responses[0], responses[2]) for x in r.outputs["predictions"]]
    expected = Counter(p["label"] for a in answers for p in a)
    base = {"model": "alpha", "version": "1"}
    assert total(c.METRIC_TEXTS, **base) == 4
    assert total(c.METRIC_UNLABELED, **base) == sum(1 for a in answers if not a) == 1
    assert {lbl: total(c.METRIC_LABEL_PREDICTIONS, label=lbl, **base) for lbl in LABELS} == {
        lbl: expected.get(lbl, 0) for lbl in LABELS
    }
    assert total(c.METRIC_NEAR_THRESHOLD, label=LABELS[2], **base) == 1  # sigmoid(0.1) = 0.525, near 0.5
    top = c.METRIC_TOP_CONFIDENCE
    assert total(f"{top}_count", **base) == total(f"{top}_bucket", le="+Inf", **base) == 4
    buckets = {le: total(f"{top}_bucket", le=le, **base) for le in ("0.1", "0.5", "0.99", "0.999")}
    assert buckets == {"0.1": 1, "0.5": 1, "0.99": 1, "0.999": 4}  # tops: sigmoid(-5) once, sigmoid(5) thrice
    assert total(f"{top}_sum", **base) == pytest.approx(3 * 0.99331 + 0.00669, abs=1e-4)
    assert total(c.METRIC_REJECTED, reason="missing_input", **base) == 1
    assert outcome(responses, 1)  # the refused request failed alone


def test_label_series_are_bounded_for_a_model_with_thousands_of_labels(load) -> None:
    c = sys.modules["seqcls_contract"]
    labels = [f"L{i}" for i in range(2000)]
    rng = np.random.default_rng(0)
    probs = rng.random((500, len(labels)), dtype=np.float32) ** 8  # a few labels per text
    ref = reference.compute(probs, [0.5] * len(labels), labels, hierarchy=False, source="golden")
    keep = reference.metric_labels(labels, ref)
    assert len(keep) == c.MAX_LABEL_SERIES - 1
    model = load("seqcls_postprocess", labels=labels, thresholds=[0.5] * len(labels), metric_labels=keep)
    logits = np.log(probs / (1 - probs + 1e-12) + 1e-12).astype(np.float32)
    (response,) = model.execute([{"logits": Tensor("logits", logits)}])
    model.metrics.flush()
    predicted = sum(len(json.loads(x[0])) for x in response.outputs["predictions"])
    per_label = series(c.METRIC_LABEL_PREDICTIONS)
    assert len(per_label) <= c.MAX_LABEL_SERIES  # 199 labels + __other__, whatever traffic comes
    assert sum(per_label.values()) == predicted  # nothing lost: the rest is summed under __other__
    assert any(("label", c.OTHER_LABEL) in k[1] for k in per_label)


def test_tokenizer_counts_truncations_and_refusals_by_reason(load) -> None:
    model = load("tokenizer", max_text_bytes=128)
    c = sys.modules["seqcls_contract"]

    def texts(*items: object) -> dict[str, Tensor]:
        return {"TEXT": Tensor("TEXT", np.array([[x] for x in items], dtype=object).reshape(len(items), 1))}

    model.execute([texts("公司宣布裁员".encode(), ("裁员" * 20).encode()), texts(b"\xff"), texts(b"a" * 129), {}])
    model.metrics.close()  # what finalize does on unload: the last sums go out
    assert total(c.METRIC_TOKENIZED) == 2 and total(c.METRIC_TRUNCATED) == 1  # max_length 8 in the fake release
    assert {k[1][1][1]: v for k, v in series(c.METRIC_REJECTED).items()} == {
        "invalid_utf8": 1,
        "too_long": 1,
        "missing_input": 1,
    }


def test_metrics_off_exports_nothing(load) -> None:
    model = load("seqcls_postprocess", config=model_config(metrics="off"))
    logits = np.array([[5.0, 5.0, -5.0]], dtype=np.float32)
    assert outcome(model.execute([{"logits": Tensor("logits", logits)}]), 0) is None
    assert not MetricFamily.series


def test_a_failing_metrics_api_fails_no_request(load, monkeypatch: pytest.MonkeyPatch) -> None:
    model = load("seqcls_postprocess")
    logits = np.array([[5.0, 5.0, -5.0]], dtype=np.float32)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("metrics down")

    monkeypatch.setattr(MetricFamily, "Metric", broken)
    model.metrics.metrics.clear()
    assert outcome(model.execute([{"logits": Tensor("logits", logits)}]), 0) is None
    model.metrics.flush()
    assert not model.metrics.enabled  # said once in Triton's log, then off: answers go on
    assert any("metrics are off" in e for e in Logger.errors)
