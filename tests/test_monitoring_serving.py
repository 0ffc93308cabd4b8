"""What the served model predicts, counted by the real Triton: the serving models' metrics after real
requests equal the counts computed from the answers, per label and per version; the release's
reference distribution travels with the version.

One module Triton and one release of the session's quick demo model (trained once, shared with the
quality-gate and demo tests); the demo's held-out split is the eval set, so it is the reference.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from seqcls.contract import shipped
from seqcls.contract.names import ModelName
from seqcls.localtriton.server import LocalTriton
from seqcls.serving import metrics as triton_metrics
from tests.helpers.demo_models import quick_demo_model
from tests.helpers.drills import Drill, make_drill
from tests.helpers.triton import start_triton

pytestmark = [pytest.mark.slow, pytest.mark.integration]

DEMO_DATA = Path(__file__).resolve().parents[1] / "tools" / "seqcls_tools" / "demo" / "data"
ARTIFACTS = Path(__file__).resolve().parents[1] / "var" / "test-artifacts"
SAMPLE_OUT = Path(__file__).resolve().parent / "data" / "triton-metrics-seqcls.txt"


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory, empty_mlflow_db: Path) -> Iterator[Drill]:
    """A Triton serving the quick demo model, released with the demo's held-out split as eval set."""
    root = tmp_path_factory.mktemp("monitoring")
    server: LocalTriton = start_triton(root, "triton", repository=root / "repo")
    shutil.copyfile(empty_mlflow_db, root / "mlflow.db")
    with pytest.MonkeyPatch.context() as mp:
        drill = make_drill(server, root / "home", root, mp)
        mp.setenv("SEQCLS_TRITON_METRICS", server.config.metrics_url)
        drill.env["SEQCLS_TRITON_METRICS"] = server.config.metrics_url
        model = quick_demo_model(tmp_path_factory).path
        drill.release(model, eval_set=str(DEMO_DATA / "test.jsonl"))
        drill.model = model  # type: ignore[attr-defined]
        yield drill
    server.stop()


def classify(drill: Drill, texts: list[str], *, per_request: int = 8) -> list[list[str]]:
    """``texts`` through the public route over gRPC, a few per request; each text's label set."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(drill.server.config.grpc_url)
    out: list[list[str]] = []
    for start in range(0, len(texts), per_request):
        chunk = texts[start : start + per_request]
        tensor = grpcclient.InferInput("TEXT", [len(chunk), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[t.encode("utf-8")] for t in chunk], dtype=object))
        result = client.infer("seqcls", [tensor], outputs=[grpcclient.InferRequestedOutput("predictions")])
        for row in result.as_numpy("predictions").reshape(-1):
            out.append([p["label"] for p in json.loads(row)])
    return out


def seqcls_series(drill: Drill) -> list[triton_metrics.Sample]:
    """The seqcls_* series once the serving models have flushed what they counted so far."""
    time.sleep(shipped.contract().METRICS_FLUSH_SECONDS + 0.5)
    return [s for s in triton_metrics.scrape(drill.server.config.metrics_url) if s.name.startswith("seqcls_")]


def value(samples, name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def fresh_texts(seed: int, n: int) -> list[dict]:
    """``n`` labeled texts from the demo's generator with another seed: the same distribution, new texts."""
    from seqcls_tools.demo.make_dataset import SPLITS, generate

    return generate(seed, {split: (n if split == SPLITS[0] else 0) for split in SPLITS})[SPLITS[0]]


def test_the_reference_distribution_travels_with_the_version(monitored: Drill) -> None:
    contract = shipped.contract()
    info = json.loads((monitored.repo / "seqcls_postprocess" / "1" / "release.json").read_text(encoding="utf-8"))
    ref = info[contract.REFERENCE_KEY]
    eval_rows = (DEMO_DATA / "test.jsonl").read_text(encoding="utf-8").splitlines()
    assert ref["source"] == "eval_set" and ref["texts"] == len(eval_rows)
    assert ref["sha256"] and sum(ref["labels"].values()) >= ref["texts"] - ref["unlabeled"]
    assert ref["confidence_counts"][-1] == ref["texts"]
    assert info[contract.METRIC_LABELS_KEY] == info["labels"]  # 20-odd labels: every one has its own series
    from mlflow.artifacts import download_artifacts
    from mlflow.tracking import MlflowClient

    uri = monitored.settings.mlflow_tracking_uri
    (version,) = MlflowClient(tracking_uri=uri).search_model_versions("name='seqcls'")
    got = download_artifacts(run_id=version.run_id, artifact_path="quality/reference.json", tracking_uri=uri)
    logged = json.loads(Path(got).read_text(encoding="utf-8"))
    assert logged == ref  # the same baseline in the registry's run as in the served version


def test_exported_counters_equal_the_counts_of_the_answers(monitored: Drill) -> None:
    contract = shipped.contract()
    before = seqcls_series(monitored)
    rows = fresh_texts(11, 120)
    texts = [r["text"] for r in rows]
    long_text = "，".join(texts[:40])  # far over max_length tokens: truncated, still answered
    answers = classify(monitored, [*texts, long_text, ""])
    too_long = "字" * (contract.MAX_TEXT_BYTES // 3 + 10)
    with pytest.raises(Exception, match="max_text_bytes"):
        classify(monitored, [too_long])
    after = seqcls_series(monitored)
    v1 = {"model": "seqcls", "version": "1"}

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **v1, **labels) - value(before, name, **v1, **labels)

    n = len(answers)
    assert delta(contract.METRIC_TEXTS) == n
    assert delta(contract.METRIC_TOKENIZED) == n
    assert delta(contract.METRIC_TRUNCATED) == 1
    assert delta(contract.METRIC_UNLABELED) == sum(1 for a in answers if not a)
    expected = Counter(label for a in answers for label in a)
    labels = json.loads((monitored.repo / "seqcls_postprocess" / "1" / "release.json").read_text("utf-8"))["labels"]
    assert {lbl: delta(contract.METRIC_LABEL_PREDICTIONS, label=lbl) for lbl in labels} == {
        lbl: float(expected.get(lbl, 0)) for lbl in labels
    }
    assert delta(f"{contract.METRIC_TOP_CONFIDENCE}_count") == n
    assert delta(contract.METRIC_REJECTED, reason="too_long") == 1
    if os.environ.get("SEQCLS_CAPTURE_METRICS"):  # refresh the sample the rules' tests read
        SAMPLE_OUT.write_text(triton_metrics_text(monitored), encoding="utf-8")


def triton_metrics_text(drill: Drill) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{drill.server.config.metrics_url}/metrics", timeout=10) as resp:
        return resp.read().decode("utf-8")


def test_a_steady_stream_reports_no_drift_and_a_shifted_one_names_the_drifted_labels(monitored: Drill) -> None:
    from datetime import timedelta

    from seqcls.monitoring.drift import DRIFT, NO_DRIFT
    from seqcls.monitoring.live import monitor

    settings = replace(monitored.settings, triton_metrics=(monitored.server.config.metrics_url,))
    monitor(settings, ModelName("seqcls"))  # a first reading: the windows below start at the readings
    time.sleep(1.2)
    steady = fresh_texts(23, 400)  # the eval set's distribution, other texts
    classify(monitored, [r["text"] for r in steady])
    time.sleep(shipped.contract().METRICS_FLUSH_SECONDS + 0.5)
    start = time.time()
    report = monitor(settings, ModelName("seqcls"), since=timedelta(seconds=1.0))
    assert report.state == NO_DRIFT, report.summary()
    assert report.texts == 400 and report.version == 1

    time.sleep(1.2)
    shifted = [r for r in fresh_texts(29, 1500) if any(lbl.startswith("体育") for lbl in r["labels"])][:300]
    classify(monitored, [r["text"] for r in shifted])
    time.sleep(shipped.contract().METRICS_FLUSH_SECONDS + 0.5)
    since = f"{max(time.time() - start - 0.6, 0.1):.1f}s"
    cli = monitored.cli("monitor", "--model-name", "seqcls", "--since", since, "--json")
    assert cli.returncode == 1, cli.stdout + cli.stderr
    out = json.loads(cli.stdout)
    assert out["state"] == DRIFT and out["texts"] == 300, out
    drifted = set(out["drifted"])
    assert "体育" in drifted  # every text is about sports now
    assert {"财经", "司法", "灾害"} <= drifted  # and the others vanished
    human = monitored.cli("monitor", "--model-name", "seqcls", "--since", since)
    assert human.returncode == 1 and "drifted" in human.stdout and "体育" in human.stdout, human.stdout
    ARTIFACTS.mkdir(parents=True, exist_ok=True)  # what an operator sees, for the notes
    (ARTIFACTS / "monitor-drift.txt").write_text(
        f"$ seqcls monitor --model-name seqcls --since {since}\n{human.stdout}\nsteady stream:\n{report.summary()}\n",
        encoding="utf-8",
    )


def test_a_second_version_counts_in_its_own_series(monitored: Drill, tmp_path: Path) -> None:
    contract = shipped.contract()
    retrain = tmp_path / "retrain"  # the same weights under another fingerprint: a new version, same answers
    shutil.copytree(monitored.model, retrain)  # type: ignore[attr-defined]
    config = json.loads((retrain / "config.json").read_text(encoding="utf-8"))
    (retrain / "config.json").write_text(json.dumps(config, indent=3, ensure_ascii=False), encoding="utf-8")
    monitored.release(retrain, eval_set=str(DEMO_DATA / "test.jsonl"))
    assert monitored.state().serving == 2
    before = seqcls_series(monitored)
    answers = classify(monitored, [r["text"] for r in fresh_texts(31, 80)])
    after = seqcls_series(monitored)
    for version, sent in (("2", len(answers)), ("1", 0)):  # v1 stays loaded (warm previous), untouched
        labels = {"model": "seqcls", "version": version}
        assert value(after, contract.METRIC_TEXTS, **labels) - value(before, contract.METRIC_TEXTS, **labels) == sent
    expected = Counter(label for a in answers for label in a)
    for label, n in expected.items():
        got = value(after, contract.METRIC_LABEL_PREDICTIONS, model="seqcls", version="2", label=label)
        assert got - value(before, contract.METRIC_LABEL_PREDICTIONS, model="seqcls", version="2", label=label) == n
    assert any(s.labels.get("version") == "1" for s in after if s.name == contract.METRIC_TEXTS)
