"""The quality evidence page (issues 24, 25): the verdict first, candidate beside champion, the plot,
then per label, the eval set, the bad cases and every check folded — for a passed, refused, skipped
and not-run gate, with links to the Airflow run, the parity page, the history and the run's MLflow run;
through FastAPI's TestClient on a workspace whose evidence evaluate's own ``write_evidence`` wrote
from hand-made predictions (no model, no Triton: fast)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.helpers.airflow import private_airflow_home

AIRFLOW_HOME = private_airflow_home()  # before anything imports airflow

from fastapi.testclient import TestClient  # noqa: E402

from seqcls.airflow.pages.app import authorized, create_app  # noqa: E402
from seqcls.contract.names import ModelName  # noqa: E402
from seqcls.gates.evalset import EvalSet  # noqa: E402
from seqcls.gates.metrics import score  # noqa: E402
from seqcls.gates.rules import QualityRules, judge  # noqa: E402
from seqcls.gates.scoring import Predictions  # noqa: E402
from seqcls.release.records import OUT_DIRS  # noqa: E402
from seqcls.release.workspace import Workspace, workspace_dir  # noqa: E402
from seqcls.settings import Settings  # noqa: E402
from seqcls.steps.evaluate import write_evidence  # noqa: E402

DAG, RUN = "seqcls_release", "manual__2026-01-01T00:00:00+00:00"
MODEL, FINGERPRINT = ModelName("news"), "0123456789abcdef" * 4
EVIL = "<script>alert(1)</script>"
LABELS = ["体育", "财经", "科技", "科技##手机", EVIL]
GOLD = [["体育"], ["财经"], ["科技", "科技##手机"], ["科技"], ["体育"], ["财经"], [EVIL], ["科技", "科技##手机"]]
TEXTS = [f"第{i}条新闻" for i in range(len(GOLD))]
#: The champion gets every text right but one; the candidate is better on 财经, worse on 体育.
CHAMPION = [["体育"], ["体育"], ["科技", "科技##手机"], ["科技"], ["体育"], ["财经"], [EVIL], ["科技"]]
CANDIDATE = [["财经"], ["财经"], ["科技", "科技##手机"], ["科技"], ["体育"], ["财经", "体育"], [EVIL], ["科技"]]
LENIENT = QualityRules(max_f1_drop=0.5, max_level_f1_drop=0.5, max_label_f1_drop=0.9)
STRICT = QualityRules(max_f1_drop=0.001, max_level_f1_drop=None, max_label_f1_drop=None)


def _predictions(name: str, rows: list[list[str]]) -> Predictions:
    probs = np.array([[0.9 if lbl in row else 0.1 for lbl in LABELS] for row in rows])
    return Predictions(name, rows, probs, LABELS, 0.01, "fp32")


def _gate(home: Path, *, rules: QualityRules, champion: int | None = 3, status: str = "ok") -> dict:
    """A release workspace whose evaluate record is ``status``, its evidence written by ``write_evidence``."""
    ws = Workspace(workspace_dir(Settings(home=home), MODEL, FINGERPRINT))
    out = ws.path(OUT_DIRS["evaluate"]) if status == "ok" else ws.failed_dir("evaluate")
    out.mkdir(parents=True)
    es = EvalSet(
        Path("/data/eval/<b>新闻</b>.tsv"), "ab" * 32, "tsv", "configured", tuple(TEXTS), tuple(map(tuple, GOLD))
    )
    answers = {"candidate": _predictions("candidate", CANDIDATE)}
    if champion is not None:
        answers["champion"] = _predictions("champion", CHAMPION)
    scores = {name: score(es.labels, p.labels, LABELS) for name, p in answers.items()}
    verdict = judge(scores["candidate"], scores.get("champion"), rules)
    release = SimpleNamespace(
        config=SimpleNamespace(model_name=MODEL, profile="fp32"),
        checkpoint=SimpleNamespace(fingerprint=FINGERPRINT, short_fingerprint=FINGERPRINT[:12]),
    )
    evaluation = write_evidence(release, es, answers, scores, verdict, champion, out)  # type: ignore[arg-type]
    error = f"GateError: Quality gate refused model 'news': {verdict.summary()} {EVIL}"
    ws.record(
        "evaluate",
        {"status": status, "mlflow_run_id": "run1"} | ({"error": error} if status != "ok" else {}),
    )
    return evaluation


def _client(home: Path, ref: dict | None = None, params: dict | None = None) -> TestClient:
    ref = ref or {"model_name": MODEL, "fingerprint": FINGERPRINT}
    app = create_app(
        lambda d, r: ref if (d, r) == (DAG, RUN) else None, Settings(home=home), params_of=lambda d, r: params or {}
    )
    app.dependency_overrides[authorized] = lambda: None
    return TestClient(app)


def _rows(page: str, table: str) -> list[str]:
    """The ``<tr>`` rows of the page's table of class ``table`` (header first)."""
    start = page.index(f"<table class='{table}'>")
    return page[start : page.index("</table>", start)].split("<tr>")[1:]


def test_passed_gate_shows_candidate_beside_champion(home: Path) -> None:
    evaluation = _gate(home, rules=LENIENT)
    client = _client(home)
    page = client.get(f"/quality/{DAG}/{RUN}")
    assert page.status_code == 200, page.text
    text = page.text
    order = [
        "<h1 class='passed'>Quality gate passed</h1>",  # the verdict first
        "<table class='headline'>",  # the key numbers: candidate beside champion
        "<img class='plot' alt='F1 per label, candidate vs champion'",
        "<table class='labels'>",  # then the details
        "<table class='evalset'>",
        "bad_cases.tsv</a>",
        "<details><summary>All ",  # every check with its threshold, folded
    ]
    positions = [text.index(part) for part in order]
    assert positions == sorted(positions), list(zip(order, positions, strict=True))
    assert "champion (Triton v3)" in text and "<th>Δ</th>" in text and "level 2 micro-F1" in text
    cand, champ = evaluation["candidate"], evaluation["champion"]
    micro = next(r for r in _rows(text, "headline") if "<th align='left'>micro-F1</th>" in r)
    delta = cand["micro_f1"] - champ["micro_f1"]
    assert f"{cand['micro_f1']:.4f}" in micro and f"{champ['micro_f1']:.4f}" in micro and f"{delta:+.4f}" in micro
    labels = _rows(text, "labels")[1:]
    assert "体育" in labels[0] and "class='n worse'" in labels[0], labels  # worst Δ first
    assert "财经" in labels[-1] and "class='n better'" in labels[-1], labels
    assert "abababababab" in text and "configured" in text and f"{len(TEXTS)}" in text
    assert 'font-family:system-ui, "Noto Sans CJK SC"' in text
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    base = "manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    assert f"src='{base}/labels.png'" in text and f"href='{base}/bad_cases.tsv'" in text
    assert f"{evaluation['bad_cases']} texts the candidate got wrong" in text
    plot = client.get(f"/quality/{DAG}/{RUN}/labels.png")
    assert plot.status_code == 200 and plot.content.startswith(b"\x89PNG")
    tsv = client.get(f"/quality/{DAG}/{RUN}/bad_cases.tsv")
    assert tsv.status_code == 200 and tsv.headers["content-type"].startswith("text/plain")
    assert tsv.headers["x-content-type-options"] == "nosniff" and "第0条新闻" in tsv.text


def test_refused_gate_names_each_failed_rule_with_both_values(home: Path) -> None:
    evaluation = _gate(home, rules=STRICT, status="failed")
    assert not evaluation["passed"] and evaluation["failures"]
    client = _client(home)
    text = client.get(f"/quality/{DAG}/{RUN}").text
    assert "Quality gate REFUSED the candidate" in text and "champion (Triton v3)" in text
    rows = _rows(text, "failures")[1:]
    assert len(rows) == len(evaluation["failures"])
    for row, failure in zip(rows, evaluation["failures"], strict=True):
        assert f"<td>{failure['rule']}</td><td>{failure['metric']}</td>" in row
        values = (failure["candidate"], failure["champion"], failure["threshold"])
        assert all(f"{v:.4f}" in row for v in values), row
    assert "<table class='headline'>" in text and "<table class='labels'>" in text  # from failed/evaluate/
    assert client.get(f"/quality/{DAG}/{RUN}/labels.png").content.startswith(b"\x89PNG")
    assert client.get(f"/quality/{DAG}/{RUN}/bad_cases.tsv").status_code == 200


def test_first_release_has_no_champion_column_values(home: Path) -> None:
    _gate(home, rules=LENIENT, champion=None)
    text = _client(home).get(f"/quality/{DAG}/{RUN}").text
    assert "Quality gate passed" in text and "champion (none: first release)" in text
    assert "0 checks passed" not in text  # says what happened: no rule applied, or how many passed
    assert "change rules skipped" in text and "class='n worse'" not in text


def test_skipped_and_not_run_gates_say_so(home: Path) -> None:
    client = _client(home)
    ws = Workspace(workspace_dir(Settings(home=home), MODEL, FINGERPRINT))
    ws.root.mkdir(parents=True)
    page = client.get(f"/quality/{DAG}/{RUN}")
    assert page.status_code == 200 and "Quality gate did not run" in page.text
    assert client.get(f"/quality/{DAG}/{RUN}/labels.png").status_code == 404
    why = "no eval set: none configured — the quality gate did not run"
    (ws.path(OUT_DIRS["evaluate"])).mkdir()
    ws.path(OUT_DIRS["evaluate"]).joinpath("evaluation.json").write_text(json.dumps({"passed": True, "skipped": [why]}))
    ws.record("evaluate", {"status": "ok", "summary": {"passed": True, "skipped": why}})
    text = client.get(f"/quality/{DAG}/{RUN}").text
    assert "Quality gate skipped" in text and f"skipped: {why}" in text and "<table class='headline'>" not in text
    assert client.get(f"/quality/{DAG}/{RUN}/bad_cases.tsv").status_code == 404


def test_everything_from_files_is_escaped(home: Path) -> None:
    _gate(home, rules=STRICT, status="failed")
    text = _client(home).get(f"/quality/{DAG}/{RUN}").text
    assert "<script>" not in text and "<b>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "&lt;b&gt;新闻&lt;/b&gt;.tsv" in text
    assert "科技##手机" in text  # CJK text stays as it is, only markup is escaped


@pytest.mark.parametrize(
    "ref",
    [
        {"model_name": "../evil", "fingerprint": FINGERPRINT},
        {"model_name": MODEL, "fingerprint": "../../../etc/passwd"},
        {"model_name": MODEL, "fingerprint": "0123456789ABCDEF"},
        {"model_name": MODEL, "fingerprint": "fedcba9876543210"},  # valid, but no such workspace
    ],
)
def test_bad_release_refs_are_refused(home: Path, ref: dict) -> None:
    _gate(home, rules=LENIENT)
    client = _client(home, ref)
    for path in ("", "/labels.png", "/bad_cases.tsv"):
        answer = client.get(f"/quality/{DAG}/{RUN}{path}")
        assert answer.status_code == 404 and "no quality evidence for run" in answer.text


def test_no_file_outside_the_workspace_is_served(home: Path, tmp_path: Path) -> None:
    _gate(home, rules=LENIENT)
    client = _client(home)
    assert client.get(f"/quality/{DAG}/..%2F..%2F..%2Fetc%2Fpasswd/bad_cases.tsv").status_code == 404
    assert client.get(f"/quality/{DAG}/{RUN}/..%2F..%2Fmanifest.json").status_code == 404
    secret = tmp_path / "secret.tsv"
    secret.write_text("secret\n")
    tsv = workspace_dir(Settings(home=home), MODEL, FINGERPRINT) / OUT_DIRS["evaluate"] / "bad_cases.tsv"
    tsv.unlink()
    tsv.symlink_to(secret)  # a link out of the workspace is not the layout's file
    answer = client.get(f"/quality/{DAG}/{RUN}/bad_cases.tsv")
    assert answer.status_code == 404 and "secret" not in answer.text
    assert "bad_cases.tsv</a>" not in client.get(f"/quality/{DAG}/{RUN}").text


def test_requires_login(home: Path) -> None:
    app = create_app(lambda d, r: None, Settings(home=home))
    for path in ("", "/labels.png", "/bad_cases.tsv"):
        assert TestClient(app).get(f"/quality/{DAG}/{RUN}{path}").status_code == 401


def test_link_on_evaluate_quality_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.models.taskinstancekey import TaskInstanceKey

    from seqcls.airflow.plugin import ParityEvidenceLink, QualityEvidenceLink, SeqclsPlugin

    key = TaskInstanceKey(DAG, "evaluate_quality", RUN, 1, -1)
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "")
    link = QualityEvidenceLink()
    assert link.name == "Quality evidence"
    assert link.get_link(None, ti_key=key) == f"/seqcls/quality/{DAG}/manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example/sub/")
    assert link.get_link(None, ti_key=key).startswith("https://airflow.example/sub/seqcls/quality/")
    assert link.get_link(None, ti_key=key._replace(task_id="validate_parity")) == ""
    assert ParityEvidenceLink().get_link(None, ti_key=key) == ""
    assert any(isinstance(x, QualityEvidenceLink) for x in SeqclsPlugin.global_operator_extra_links)


def test_links_to_the_run_the_parity_page_the_history_and_the_runs_mlflow(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _gate(home, rules=LENIENT)
    conn = {"conn_type": "mlflow", "extra": {"tracking_uri": "https://mlflow.example"}}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_QUALITY", json.dumps(conn))
    text = _client(home, params={"mlflow_conn_id": "mlflow_quality"}).get(f"/quality/{DAG}/{RUN}").text
    bar = text[text.index("<nav class='links'>") : text.index("</nav>")]
    base = "manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    for href in (
        f"../../../dags/{DAG}/runs/{base}",
        f"../../parity/{DAG}/{base}",
        f"../../history/{MODEL}",
        "https://mlflow.example/#/runs/run1",
    ):
        assert f"href='{href}'" in bar, (href, bar)
    assert "news · quality gate · run manual__2026-01-01T00:00:00+00:00" in bar
    sqlite = _client(home).get(f"/quality/{DAG}/{RUN}").text  # the default: the sqlite store under the home
    assert "MLflow run run1: its tracking store has no UI" in sqlite and "/#/runs/" not in sqlite
