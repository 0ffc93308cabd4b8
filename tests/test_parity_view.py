"""The parity evidence page (issue 14): a passed and a failed gate, through FastAPI's TestClient."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from seqcls.airflow.parity_view import authorized, create_app
from seqcls.errors import GateError
from seqcls.settings import Settings
from seqcls.steps import run_release
from seqcls.steps.validate import validate
from seqcls.workspace import open_release

DAG, RUN = "seqcls_release", "manual__2026-01-01T00:00:00+00:00"


def _client(release, settings: Settings, **kwargs) -> TestClient:
    ref = {"model_name": release.config.model_name, "fingerprint": release.checkpoint.fingerprint}
    app = create_app(lambda d, r: ref if (d, r) == (DAG, RUN) else None, settings, **kwargs)
    app.dependency_overrides[authorized] = lambda: None
    return TestClient(app)


def test_page_for_a_passed_gate(tiny_checkpoint: Path) -> None:
    release = open_release(tiny_checkpoint)
    run_release(release, until="validate")
    run_id = release.workspace.step("validate")["mlflow_run_id"]
    settings = Settings(home=release.settings.home, mlflow_tracking_uri="http://mlflow.example:5000")
    client = _client(release, settings, experiment_of=lambda r: "7" if r == run_id else None)
    page = client.get(f"/parity/{DAG}/{RUN}")
    assert page.status_code == 200, page.text
    assert "Parity gate passed" in page.text and "numeric." in page.text and "texts" in page.text
    assert f"http://mlflow.example:5000/#/experiments/7/runs/{run_id}" in page.text
    assert "manual__2026-01-01T00%3A00%3A00%2B00%3A00/plot.png" in page.text
    plot = client.get(f"/parity/{DAG}/{RUN}/plot.png")
    assert plot.status_code == 200 and plot.content.startswith(b"\x89PNG")
    missing = client.get(f"/parity/{DAG}/other_run")
    assert missing.status_code == 404 and "no parity evidence for run 'other_run'" in missing.text


def test_page_for_a_failed_gate(tiny_checkpoint: Path) -> None:
    vocab = (tiny_checkpoint / "vocab.txt").read_text(encoding="utf-8").splitlines()
    vocab[vocab.index("公")] = "公 "  # the tokenizers disagree: the gate fails
    (tiny_checkpoint / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    release = open_release(tiny_checkpoint)
    run_release(release, until="convert")
    with pytest.raises(GateError):
        validate(release)
    client = _client(release, release.settings)  # a sqlite tracking store: no MLflow link
    page = client.get(f"/parity/{DAG}/{RUN}")
    assert page.status_code == 200, page.text
    assert "Parity gate FAILED" in page.text and "tokenizer ids differ" in page.text
    assert "tokenizer.mismatched" in page.text and "/#/experiments/" not in page.text
    assert client.get(f"/parity/{DAG}/{RUN}/plot.png").content.startswith(b"\x89PNG")


def test_requires_login(tiny_checkpoint: Path) -> None:
    app = create_app(lambda d, r: None, Settings())
    assert TestClient(app).get(f"/parity/{DAG}/{RUN}").status_code == 401


def test_link_url_from_the_ti_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.models.taskinstancekey import TaskInstanceKey

    from seqcls.airflow.plugin import ParityEvidenceLink, SeqclsPlugin

    key = TaskInstanceKey(DAG, "validate_parity", RUN, 1, -1)
    link = ParityEvidenceLink()
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "")
    assert link.get_link(None, ti_key=key) == f"/seqcls/parity/{DAG}/manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example/sub/")
    assert link.get_link(None, ti_key=key).startswith("https://airflow.example/sub/seqcls/parity/")
    assert link.get_link(None, ti_key=key._replace(task_id="convert_onnx")) == ""
    assert SeqclsPlugin.fastapi_apps[0]["url_prefix"] == "/seqcls"
