"""The history page in the Airflow UI (issue 25): ``seqcls history`` as a table — what serves now first,
then every change newest first with both version numbers, fingerprint, verdicts, who, reason, and
links to the Airflow run, its evidence and the MLflow version (from the model's own MLflow
Connection); the index of every model. Logs written by the real writer (``write_state``,
``append_event``); MLflow's side of the join faked at the two names ``seqcls.ops.history`` asks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urljoin

import pytest

from tests.helpers.airflow import private_airflow_home

AIRFLOW_HOME = private_airflow_home()  # before anything imports airflow

from fastapi.testclient import TestClient  # noqa: E402

import seqcls.ops.history  # noqa: E402
from seqcls.airflow.pages.app import authorized, create_app  # noqa: E402
from seqcls.contract.names import ModelName  # noqa: E402
from seqcls.registry.runs import PARITY_TAG, QUALITY_TAG  # noqa: E402
from seqcls.serving.state import ServingState, append_event, write_state  # noqa: E402
from seqcls.settings import Settings  # noqa: E402

MODEL, DAG = ModelName("news"), "seqcls_release__news"
RUN_A, RUN_B = "manual__2026-01-01T00:00:00+00:00", "scheduled__2026-01-02T03:00:00+00:00"
FP_A, FP_B, FP_C = "a" * 64, "b" * 64, "c" * 64
MLFLOW = {FP_A: 7, FP_B: 9}  # registry numbers unlike the Triton ones: the page must show both
EVIL = "<b>refunds</b>"
PAGE = f"http://airflow.example/sub/seqcls/history/{MODEL}"


def _as_task(monkeypatch: pytest.MonkeyPatch, run_id: str) -> None:
    monkeypatch.setenv("AIRFLOW_CTX_DAG_ID", DAG)
    monkeypatch.setenv("AIRFLOW_CTX_DAG_RUN_ID", run_id)
    monkeypatch.setenv("AIRFLOW_CTX_TRY_NUMBER", "1")


def _log(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Release A (run A), release B (run B), a rollback by hand, a refusal by the quality gate."""
    _as_task(monkeypatch, RUN_A)
    s = write_state(repo, ServingState.empty(MODEL).with_candidate(1, FP_A, "release:a"), expected_generation=0)
    s = write_state(repo, s.promoted(1, FP_A, "release:a"), expected_generation=s.generation)
    _as_task(monkeypatch, RUN_B)
    s = write_state(repo, s.with_candidate(2, FP_B, "release:b"), expected_generation=s.generation)
    s = write_state(repo, s.promoted(2, FP_B, "release:b"), expected_generation=s.generation)
    for var in ("AIRFLOW_CTX_DAG_ID", "AIRFLOW_CTX_DAG_RUN_ID", "AIRFLOW_CTX_TRY_NUMBER"):
        monkeypatch.delenv(var)
    s = write_state(repo, s.rolled_back("rollback:news:cli", f"B misroutes {EVIL}"), expected_generation=s.generation)
    append_event(repo, MODEL, "refused", gate="quality", fingerprint=FP_C, serving=1, reason="max_f1_drop on 财经")


def _registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow holds FP_A as v7 and FP_B as v9; their runs carry both gates' verdicts."""
    tags = {PARITY_TAG: "passed", QUALITY_TAG: "passed"}
    run = SimpleNamespace(data=SimpleNamespace(tags=tags))
    monkeypatch.setattr(seqcls.ops.history, "client", lambda settings: SimpleNamespace(get_run=lambda run_id: run))

    def find(client, name: str, fp: str | None, release_key: str | None = None):
        return SimpleNamespace(version=str(MLFLOW[fp]), run_id="r") if fp in MLFLOW else None

    monkeypatch.setattr(seqcls.ops.history, "find_version", find)


def _client(settings: Settings, dags: dict | None = None) -> TestClient:
    app = create_app(lambda d, r: None, settings, dags=lambda: dict(dags or {}))
    app.dependency_overrides[authorized] = lambda: None
    return TestClient(app)


@pytest.fixture
def released(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    settings = Settings.from_env(home=tmp_path / "home", triton_repository=tmp_path / "repo")
    _log(Path(str(settings.triton_repository)), monkeypatch)
    conn = {"conn_type": "mlflow", "extra": {"tracking_uri": "http://mlflow.news:5000"}}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_NEWS", json.dumps(conn))
    return settings


def _rows(text: str) -> list[str]:
    table = text[text.index("<table class='history'>") :]
    return table[: table.index("</table>")].split("<tr>")[2:]  # after the header row


def test_every_change_newest_first_in_both_numberings(released: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    _registry(monkeypatch)
    dags = {MODEL: {"dag_id": DAG, "mlflow_conn_id": "mlflow_news"}}
    page = _client(released, dags).get(f"/history/{MODEL}")
    assert page.status_code == 200, page.text
    text = page.text
    assert text.index("<h1 class='passed'>news serves Triton v1 (MLflow v7)</h1>") < text.index("<table")
    rows = _rows(text)
    kinds = [r.split("<span class='kind ", 1)[1].split("'", 1)[0] for r in rows]
    assert kinds == ["refused", "rollback", "expose", "release-candidate", "expose", "release-candidate"]
    refused, rollback, expose_b = rows[0], rows[1], rows[2]
    assert "Triton v1 (MLflow v7) unchanged" in refused and "quality gate refused" in refused
    assert "max_f1_drop on 财经" in refused and f"<code title='{FP_C}'>cccccccccccc</code>" in refused
    assert "Triton v2 (MLflow v9) → Triton v1 (MLflow v7)" in rollback
    assert "B misroutes &lt;b&gt;refunds&lt;/b&gt;" in rollback and "<b>" not in text
    assert "Triton v1 (MLflow v7) → Triton v2 (MLflow v9)" in expose_b
    assert "<span class='passed'>parity passed</span>, <span class='passed'>quality passed</span>" in expose_b
    assert f"(dag {DAG} run {RUN_B} try 1)" in expose_b
    hrefs = {label: href for href, label in re.findall(r"<a href='([^']*)'[^>]*>([^<]*)</a>", expose_b)}
    q = "scheduled__2026-01-02T03%3A00%3A00%2B00%3A00"
    assert urljoin(PAGE, hrefs["Airflow run"]) == f"http://airflow.example/sub/dags/{DAG}/runs/{q}"
    assert urljoin(PAGE, hrefs["parity"]) == f"http://airflow.example/sub/seqcls/parity/{DAG}/{q}"
    assert urljoin(PAGE, hrefs["quality"]) == f"http://airflow.example/sub/seqcls/quality/{DAG}/{q}"
    assert hrefs["MLflow v9"] == "http://mlflow.news:5000/#/models/news/versions/9"  # the model's own Connection
    assert "Airflow run" not in rollback  # done by hand: no run to link
    assert urljoin(PAGE, "../history") == "http://airflow.example/sub/seqcls/history"
    assert "href='../history'>All models</a>" in text and f"href='../../dags/{DAG}'>Release DAG</a>" in text


def test_notes_are_shown_mlflow_down_and_an_unreadable_repository(
    released: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down(settings: Settings):
        raise ConnectionError("http://mlflow.news:5000: Connection refused")

    monkeypatch.setattr(seqcls.ops.history, "client", down)
    text = _client(released, {MODEL: {"dag_id": DAG, "mlflow_conn_id": "mlflow_news"}}).get(f"/history/{MODEL}").text
    assert "note: MLflow was unreachable (http://mlflow.news:5000: Connection refused)" in text
    assert "news serves Triton v1</h1>" in text and "Triton v2 → Triton v1" in text  # the Triton numbers alone
    elsewhere = Settings.from_env(home=tmp_path / "home", triton_repository=tmp_path / "not-mounted")
    text = _client(elsewhere).get(f"/history/{MODEL}").text
    assert f"note: the model repository {tmp_path / 'not-mounted'} is not readable from the API server" in text
    assert "news: nothing released yet" in text


def test_the_index_lists_release_dags_and_logged_models(released: Settings) -> None:
    text = _client(released, {"beta": {"dag_id": "seqcls_release__beta"}}).get("/history").text
    models = text[text.index("<table class='models'>") :]
    assert models.index("href='history/beta'") < models.index(f"href='history/{MODEL}'")
    assert "<code>seqcls_release__beta</code>" in models and "nothing recorded" in models
    news = models[models.index(f"href='history/{MODEL}'") :]
    assert "<td class='n'>6</td>" in news and "refused</span> Triton v1 unchanged" in news.split("</tr>")[0]
    assert urljoin("http://airflow.example/sub/seqcls/history", "history/news").endswith("/sub/seqcls/history/news")


def test_bad_model_names_and_login(released: Settings) -> None:
    client = _client(released)
    for bad in ("..", "a b", "-x"):
        assert client.get(f"/history/{bad}").status_code == 404
    app = create_app(lambda d, r: None, released, dags=dict)
    assert TestClient(app).get("/history").status_code == 401
    assert TestClient(app).get(f"/history/{MODEL}").status_code == 401
