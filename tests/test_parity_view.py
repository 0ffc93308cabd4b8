"""The parity evidence page (issues 14, 25): a page people read — the verdict and the key figures first,
then the plot, then every figure with the per-label thresholds folded; links to the Airflow run, the
other gate, the model's history and the MLflow run of the run's *own* MLflow Connection (none for a
sqlite store). Through FastAPI's TestClient: a real passed and failed gate (tiny checkpoint), and a
hand-written report for the layout and escaping (fast)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urljoin

import pytest

from tests.helpers.airflow import private_airflow_home

AIRFLOW_HOME = private_airflow_home()  # before anything imports airflow

from fastapi.testclient import TestClient  # noqa: E402

from seqcls.airflow.pages.app import authorized, create_app  # noqa: E402
from seqcls.contract.names import ModelName  # noqa: E402
from seqcls.errors import GateError  # noqa: E402
from seqcls.release.intake import open_release  # noqa: E402
from seqcls.release.records import OUT_DIRS  # noqa: E402
from seqcls.release.workspace import Workspace, workspace_dir  # noqa: E402
from seqcls.settings import Settings  # noqa: E402
from seqcls.steps import run_release  # noqa: E402
from seqcls.steps.validate import validate  # noqa: E402

DAG, RUN = "seqcls_release", "manual__2026-01-01T00:00:00+00:00"
QRUN = "manual__2026-01-01T00%3A00%3A00%2B00%3A00"
PAGE = f"http://airflow.example/sub/seqcls/parity/{DAG}/{QRUN}"  # where a browser has the page
MODEL, FINGERPRINT = ModelName("news"), "fedcba9876543210" * 4
EVIL = "<script>alert(1)</script>"
LABELS = ["组织关系", "组织关系##裁员", "组织关系##加盟", "财经", "财经##融资", EVIL]
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16


def _client(ref: dict, settings: Settings, params: dict | None = None) -> TestClient:
    app = create_app(
        lambda d, r: ref if (d, r) == (DAG, RUN) else None, settings, params_of=lambda d, r: dict(params or {})
    )
    app.dependency_overrides[authorized] = lambda: None
    return TestClient(app)


def _hrefs(text: str) -> dict[str, str]:
    """The links bar: label → href."""
    bar = text[text.index("<nav class='links'>") : text.index("</nav>")]
    return {label: href for href, label in re.findall(r"<a href='([^']*)'[^>]*>([^<]*)</a>", bar)}


def _report(passed: bool) -> dict:
    numeric = {
        "logits_max_abs_diff": 3.3e-06 if passed else 0.42,
        "logits_out_of_tolerance": 0 if passed else 17,
        "prob_max_abs_diff": 3.9e-07 if passed else 0.08,
        "prob_out_of_tolerance": 0 if passed else 9,
        "atol": 1e-08,
        "rtol": 0.001,
        "prob_tolerance": "derived: (atol + rtol·|x|)/4",
        "finite": True,
        "passed": passed,
        "gating": True,
    }
    change = {
        "index": 3,
        "text": f"某公司{EVIL}裁员",
        "paddle": [LABELS[1]],
        "onnxruntime": [],
        "near_threshold": False,
    }
    changes = [] if passed else [change]
    return {
        "model_name": MODEL,
        "fingerprint": FINGERPRINT,
        "golden_source": "built-in golden set",
        "texts": 65,
        "profile": "fp32",
        "provider": "CPUExecutionProvider",
        "tokenizer": {"texts": 65, "mismatched": 0, "passed": True, "reference": "paddlenlp", "serving": "wordpiece"},
        "numeric": numeric,
        "decisions": {
            "texts": 65,
            "changed": len(changes),
            "near_threshold": 0,
            "label_decisions": 390,
            "label_decisions_changed": len(changes),
            "agreement": 1 - len(changes) / 390,
            "changes": changes,
            "passed": passed,
        },
        "thresholds": {label: 0.5 for label in LABELS},
        "seconds": 2.7,
        "passed": passed,
        "gate_errors": [] if passed else [f"logits max |Δ| 0.42 out of tolerance on {EVIL}"],
    }


def _workspace(home: Path, *, passed: bool) -> Path:
    """A release workspace whose validate record and report are the gate's layout (hand-written figures)."""
    ws = Workspace(workspace_dir(Settings(home=home), MODEL, FINGERPRINT))
    out = ws.path(OUT_DIRS["validate"]) if passed else ws.failed_dir("validate")
    out.mkdir(parents=True)
    (out / "report.json").write_text(json.dumps(_report(passed), ensure_ascii=False), encoding="utf-8")
    (out / "plot.png").write_bytes(PNG)
    error = {} if passed else {"error": f"GateError: Parity gate failed for model 'news': {EVIL}"}
    ws.record("validate", {"status": "ok" if passed else "failed", "mlflow_run_id": "0123abcd"} | error)
    return ws.root


REF = {"model_name": MODEL, "fingerprint": FINGERPRINT}


def test_verdict_and_key_figures_come_before_the_plot_and_the_details(home: Path) -> None:
    _workspace(home, passed=True)
    page = _client(REF, Settings(home=home)).get(f"/parity/{DAG}/{RUN}")
    assert page.status_code == 200, page.text
    text = page.text
    order = [
        "<nav class='links'>",
        "<h1 class='passed'>Parity gate passed</h1>",
        "<div class='k'>Tokenizer ids</div><div class='v'>0 of 65 texts differ</div>",
        "<div class='k'>Logits max |Δ|</div><div class='v'>3.3e-06</div>",
        "allowed 1e-08 + 0.001·|x|; 0 out of tolerance",  # the tolerance as the run set it, exactly
        "<div class='k'>Label decisions</div><div class='v'>390 of 390 kept</div>",
        f"<img class='plot' alt='parity plot: reference vs ONNX Runtime' src='{QRUN}/plot.png'>",
        "<h2>All figures</h2>",
        "<details><summary>Decision thresholds (6 labels)</summary>",
    ]
    positions = [text.index(part) for part in order]
    assert positions == sorted(positions), list(zip(order, positions, strict=True))
    thresholds = text[text.index("<details><summary>Decision thresholds") :]
    assert "<th>组织关系##裁员</th><td>0.5</td>" in thresholds  # every label, folded
    assert 'font-family:system-ui, "Noto Sans CJK SC"' in text and "<meta charset='utf-8'>" in text
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_links_to_the_airflow_run_the_other_gate_and_the_history_resolve_under_any_sub_path(home: Path) -> None:
    _workspace(home, passed=True)
    links = _hrefs(_client(REF, Settings(home=home)).get(f"/parity/{DAG}/{RUN}").text)
    assert urljoin(PAGE, links["Airflow run"]) == f"http://airflow.example/sub/dags/{DAG}/runs/{QRUN}"
    assert urljoin(PAGE, links["Quality evidence"]) == f"http://airflow.example/sub/seqcls/quality/{DAG}/{QRUN}"
    assert urljoin(PAGE, links["History of news"]) == "http://airflow.example/sub/seqcls/history/news"
    assert "Parity evidence" not in links  # not a link to itself


def test_mlflow_link_comes_from_the_runs_own_connection(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API server's settings say one MLflow, the run's ``mlflow_conn_id`` another: the run's wins."""
    _workspace(home, passed=True)
    api_server = Settings(home=home, mlflow_tracking_uri="http://api-server-env:5000")
    conn = {"conn_type": "mlflow", "extra": {"tracking_uri": "http://mlflow.team-a:5000"}}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_TEAM_A", json.dumps(conn))
    text = _client(REF, api_server, {"mlflow_conn_id": "mlflow_team_a"}).get(f"/parity/{DAG}/{RUN}").text
    assert _hrefs(text)["MLflow run"] == "http://mlflow.team-a:5000/#/runs/0123abcd"
    assert "api-server-env" not in text
    sqlite = {"conn_type": "mlflow", "extra": {"tracking_uri": f"sqlite:///{home}/mlflow.db"}}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_LOCAL", json.dumps(sqlite))
    text = _client(REF, api_server, {"mlflow_conn_id": "mlflow_local"}).get(f"/parity/{DAG}/{RUN}").text
    assert "MLflow run" not in _hrefs(text) and "/#/runs/" not in text  # a sqlite store has no UI
    assert "MLflow run 0123abcd: its tracking store has no UI" in text


def test_a_failed_gate_says_why_first_and_lists_the_changed_decisions(home: Path) -> None:
    _workspace(home, passed=False)
    text = _client(REF, Settings(home=home)).get(f"/parity/{DAG}/{RUN}").text
    verdict = text[text.index("<section class='verdict failed'>") : text.index("</section>")]
    assert "Parity gate FAILED" in verdict and "logits max |Δ| 0.42 out of tolerance on &lt;script&gt;" in verdict
    assert text.index("</section>") < text.index("<img class='plot'") < text.index("<h2>Changed label sets</h2>")
    assert "<div class='card bad'><div class='k'>Logits max |Δ|</div>" in text
    assert "<td>某公司&lt;script&gt;alert(1)&lt;/script&gt;裁员</td><td>组织关系##裁员</td>" in text
    assert "<details><summary>The failure as the task logged it</summary>" in text
    assert "<script>" not in text


def test_page_for_a_passed_gate(tiny_checkpoint: Path) -> None:
    release = open_release(tiny_checkpoint)
    run_release(release, until="validate")
    run_id = release.workspace.step("validate")["mlflow_run_id"]
    ref = {"model_name": release.config.model_name, "fingerprint": release.checkpoint.fingerprint}
    client = _client(ref, release.settings)
    page = client.get(f"/parity/{DAG}/{RUN}")
    assert page.status_code == 200, page.text
    assert "Parity gate passed" in page.text and "0 of 65 texts differ" in page.text
    assert "<h2>All figures</h2>" in page.text and "<th>numeric.logits_max_abs_diff</th>" in page.text
    assert f"MLflow run {run_id}: its tracking store has no UI" in page.text  # the default sqlite store
    assert f"{QRUN}/plot.png" in page.text
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
    ref = {"model_name": release.config.model_name, "fingerprint": release.checkpoint.fingerprint}
    client = _client(ref, release.settings)
    page = client.get(f"/parity/{DAG}/{RUN}")
    assert page.status_code == 200, page.text
    text = page.text
    assert "Parity gate FAILED" in text and "tokenizer ids differ" in text
    assert "<div class='card bad'><div class='k'>Tokenizer ids</div>" in text
    assert text.index("tokenizer ids differ") < text.index("<img class='plot'")  # why, before the plot
    assert "/#/runs/" not in text
    assert client.get(f"/parity/{DAG}/{RUN}/plot.png").content.startswith(b"\x89PNG")


def test_requires_login() -> None:
    app = create_app(lambda d, r: None, Settings())
    assert TestClient(app).get(f"/parity/{DAG}/{RUN}").status_code == 401


def test_link_url_from_the_ti_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.models.taskinstancekey import TaskInstanceKey

    from seqcls.airflow.plugin import ParityEvidenceLink, SeqclsPlugin

    key = TaskInstanceKey(DAG, "validate_parity", RUN, 1, -1)
    link = ParityEvidenceLink()
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "")
    assert link.get_link(None, ti_key=key) == f"/seqcls/parity/{DAG}/{QRUN}"
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example/sub/")
    assert link.get_link(None, ti_key=key).startswith("https://airflow.example/sub/seqcls/parity/")
    assert link.get_link(None, ti_key=key._replace(task_id="convert_onnx")) == ""
    assert SeqclsPlugin.fastapi_apps[0]["url_prefix"] == "/seqcls"


def test_the_pages_are_where_people_look() -> None:
    """Tabs on every DAG run (the UI fills {DAG_ID}/{RUN_ID}) and the history in the Browse menu."""
    from seqcls.airflow.plugin import SeqclsPlugin, external_views

    views = {v["name"]: v for v in external_views("https://airflow.example/sub")}
    assert views["Parity evidence"]["href"] == "https://airflow.example/sub/seqcls/parity/{DAG_ID}/{RUN_ID}"
    assert views["Quality evidence"]["href"] == "https://airflow.example/sub/seqcls/quality/{DAG_ID}/{RUN_ID}"
    assert {views[n]["destination"] for n in ("Parity evidence", "Quality evidence")} == {"dag_run"}
    history = views["Release history"]
    assert (history["href"], history["destination"], history["category"]) == (
        "https://airflow.example/sub/seqcls/history",
        "nav",
        "browse",
    )
    assert len({v["url_route"] for v in SeqclsPlugin.external_views}) == 3


def test_an_old_runs_triton_link_leads_to_the_history_once_its_version_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 25: the *Triton model* link of an old run pointed at a version no longer loaded (a 400)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from types import SimpleNamespace

    from seqcls.airflow import plugin

    class Triton(BaseHTTPRequestHandler):  # answers /ready as Triton does: 200 loaded, 400 not
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/v2/models/seqcls/versions/2/ready" else 400)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Triton)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_port}/v2/models/seqcls/versions"
    pushed: dict[str, str] = {}
    monkeypatch.setattr(plugin, "pushed_value", lambda ti_key, key: pushed.get(ti_key.run_id))
    link = plugin.TritonModelLink()
    try:
        for run, version in (("old", 1), ("new", 2)):
            pushed[run] = f"{base}/{version}"
        assert link.get_link(None, ti_key=SimpleNamespace(run_id="new")) == f"{base}/2"  # still loaded
        assert link.get_link(None, ti_key=SimpleNamespace(run_id="old")).endswith("/seqcls/history/seqcls")
    finally:
        httpd.shutdown()
    pushed["down"] = f"{base}/1"  # Triton does not answer: the link as the task pushed it
    assert link.get_link(None, ti_key=SimpleNamespace(run_id="down")) == f"{base}/1"
