"""The evidence pages behind the ``Parity evidence`` and ``Quality evidence`` extra links.

A FastAPI app the plugin mounts in the API server under ``/seqcls`` (:data:`URL_PREFIX`):

- ``GET /seqcls/parity/{dag_id}/{run_id}`` — ``validate_parity``: the gate's outcome, the report's
  figures, the plot inline and the MLflow run, for a passed gate (``parity/``) and a failed one
  (``failed/validate/``), whose task pushed no XCom;
- ``GET /seqcls/quality/{dag_id}/{run_id}`` — ``evaluate_quality``: the verdict (each failed rule
  with both values), candidate beside champion (headline metrics, per level, per label with Δ), the
  eval set, ``labels.png`` inline and ``bad_cases.tsv`` as text, for a passed gate (``quality/``), a
  refused one (``failed/evaluate/``), a skipped one (no eval set) and one that did not run.

The release is found from what ``resolve_checkpoint`` returned for that run (model, fingerprint),
its workspace is recomputed from the settings (:func:`seqcls.workspace.workspace_dir`) and only
read. No part of the request names a file: each file's path is the layout's own
(:mod:`seqcls.records`), and must resolve inside the workspace.

Access: the same login as the UI (the ``_token`` cookie or a bearer token) and read access to the
DAG's task instances, through Airflow's own API dependencies (imported when a request comes).
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from seqcls.airflow.context import RESOLVE_TASK
from seqcls.airflow.report import pushed_value
from seqcls.records import BAD_CASES, EVALUATION, OUT_DIRS, PARITY_PLOT, PARITY_REPORT, QUALITY_PLOT
from seqcls.settings import Settings
from seqcls.workspace import Workspace, workspace_dir

URL_PREFIX = "/seqcls"
_FINGERPRINT = re.compile(r"^[0-9a-f]{16,128}$")
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

QUALITY_STEP = "evaluate"
#: Label names are often Chinese: a stack that finds a CJK face on Linux, macOS and Windows.
FONTS = 'system-ui, "Noto Sans CJK SC", "WenQuanYi Zen Hei", "Microsoft YaHei", sans-serif'
#: Everything on the page is escaped; the policy still forbids scripts, so one escaping slip is not an XSS.
PAGE_CSP = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'"
STYLE = (
    f"body{{font-family:{FONTS};margin:1.5em;max-width:70em}}"
    "table{border-collapse:collapse;margin:.5em 0 1em}th,td{border:1px solid #ccc;padding:.2em .6em}"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}.worse{color:#b00020}.better{color:#1b5e20}"
    ".passed{color:#1b5e20}.refused{color:#b00020}.skipped,.muted{color:#666}"
)
#: The headline rows of the quality table: Scores field → what the page calls it.
HEADLINE = (
    ("micro_f1", "micro-F1"),
    ("macro_f1", "macro-F1"),
    ("sample_accuracy", "sample accuracy"),
    ("hierarchical_f1", "hierarchical F1"),
    ("hierarchy_consistency", "hierarchy consistency"),
)

#: (dag_id, run_id) → what resolve_checkpoint returned (model_name, fingerprint, ...) or None.
Lookup = Callable[[str, str], "dict[str, Any] | None"]


def evidence_path(dag_id: str, run_id: str) -> str:
    """The parity page's path under the API server (ids URL-encoded: run ids hold ``:`` and ``+``)."""
    return f"{URL_PREFIX}/parity/{quote(dag_id, safe='')}/{quote(run_id, safe='')}"


def quality_path(dag_id: str, run_id: str) -> str:
    """The quality page's path under the API server (ids URL-encoded like :func:`evidence_path`)."""
    return f"{URL_PREFIX}/quality/{quote(dag_id, safe='')}/{quote(run_id, safe='')}"


def resolved_release(dag_id: str, run_id: str) -> dict[str, Any] | None:
    """What ``resolve_checkpoint`` returned for the run, read from the metadata database."""
    from airflow.models.taskinstancekey import TaskInstanceKey  # Airflow core: in the API server only

    value = pushed_value(TaskInstanceKey(dag_id, RESOLVE_TASK, run_id, -1, -1), "return_value")
    return value if isinstance(value, dict) else None


async def authorized(request: Request) -> None:
    """The UI's login + read access to the DAG's task instances (401/403 otherwise)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user, requires_access_dag

    user = await get_user(request, None, await bearer_scheme(request))
    requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE)(request, user)


def workspace_of(ref: dict[str, Any], settings) -> Path | None:
    """The release's workspace, from the resolved model + fingerprint, confined to the releases dir."""
    model, fingerprint = str(ref.get("model_name") or ""), str(ref.get("fingerprint") or "")
    if not _MODEL.match(model) or not _FINGERPRINT.match(fingerprint):
        return None
    releases = Path(settings.releases_dir).resolve()
    root = workspace_dir(settings, model, fingerprint).resolve()
    return root if root.is_relative_to(releases) and root.is_dir() else None


def evidence(root: Path) -> dict[str, Any] | None:
    """The validate record, outcome, report and plot path of a workspace (None: no evidence)."""
    ws = Workspace(root)
    record = ws.step("validate")
    if not record or record.get("status") not in ("ok", "failed"):
        return None
    passed = record["status"] == "ok"
    directory = ws.path(OUT_DIRS["validate"]) if passed else ws.failed_dir("validate")
    report_file, plot = directory / Path(PARITY_REPORT).name, directory / Path(PARITY_PLOT).name
    report = json.loads(report_file.read_text(encoding="utf-8")) if report_file.is_file() else None
    if report is None and passed:
        return None
    return {"record": record, "passed": passed, "report": report, "plot": plot if plot.is_file() else None}


def mlflow_run_url(uri: str, run_id: str | None, experiment_of: Callable[[str], str | None]) -> str | None:
    if not run_id or not str(uri).startswith(("http://", "https://")):
        return None
    exp = experiment_of(run_id)
    return f"{str(uri).rstrip('/')}/#/experiments/{exp}/runs/{run_id}" if exp else None


def _experiment_of(uri: str) -> Callable[[str], str | None]:
    def lookup(run_id: str) -> str | None:
        try:
            from mlflow.tracking import MlflowClient

            return MlflowClient(uri).get_run(run_id).info.experiment_id
        except Exception:  # MLflow down or the run gone: the page shows the run id without a link
            return None

    return lookup


def _scalar(value: Any) -> str | None:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int | str) and len(str(value)) <= 200:
        return str(value)
    return None


def _figures(report: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [(k, _scalar(report.get(k))) for k in ("texts", "profile", "provider", "golden_source", "passed")]
    for section in ("numeric", "decisions", "tokenizer"):
        rows += [(f"{section}.{k}", _scalar(v)) for k, v in (report.get(section) or {}).items()]
    rows += [(f"thresholds.{k}", _scalar(v)) for k, v in (report.get("thresholds") or {}).items()]
    return [(k, v) for k, v in rows if v is not None]


def _head(title: str) -> str:
    """The document's start: UTF-8, the CJK font stack, the title escaped."""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>"
    )


def render(dag_id: str, run_id: str, found: dict[str, Any], mlflow_url: str | None, plot_src: str) -> str:
    e = html.escape
    record, report = found["record"], found["report"] or {}
    outcome = "passed" if found["passed"] else "FAILED"
    parts = [
        _head(f"Parity evidence — {run_id}"),
        f"<h1>Parity gate {outcome}</h1><p>DAG <code>{e(dag_id)}</code>, run <code>{e(run_id)}</code>, "
        f"model <code>{e(str(report.get('model_name', '')))}</code>, "
        f"fingerprint <code>{e(str(report.get('fingerprint', ''))[:16])}</code></p>",
    ]
    if record.get("error"):
        parts.append(f"<pre style='white-space:pre-wrap'>{e(record['error'])}</pre>")
    for err in report.get("gate_errors") or []:
        parts.append(f"<p>• {e(str(err))}</p>")
    rows = "".join(f"<tr><th align='left'>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _figures(report))
    parts.append(f"<table>{rows}</table>" if rows else "<p>The gate failed before it wrote a report.</p>")
    if found["plot"]:
        parts.append(f"<p><img alt='parity plot' src='{e(plot_src)}' style='max-width:100%'></p>")
    parts.append(_mlflow_line(record, mlflow_url))
    return "".join(parts) + "</body></html>"


def _mlflow_line(record: dict[str, Any], mlflow_url: str | None) -> str:
    e, run = html.escape, record.get("mlflow_run_id")
    if mlflow_url:
        return f"<p><a href='{e(mlflow_url)}'>MLflow run {e(str(run))}</a></p>"
    return f"<p>MLflow run <code>{e(str(run))}</code></p>" if run else ""


# --- the quality gate: evaluate_quality ----------------------------------------------------------


def _confined(directory: Path, rel: str, root: Path) -> Path | None:
    """The layout file ``rel`` in ``directory``, if a regular file inside the workspace (no symlink out)."""
    path = (directory / Path(rel).name).resolve()
    return path if path.is_relative_to(root) and path.is_file() else None


def _read_json(path: Path | None) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8")) if path else None
    except (OSError, ValueError):  # damaged evidence: the page says it is missing rather than failing
        return None
    return value if isinstance(value, dict) else None


def quality_evidence(root: Path) -> dict[str, Any]:
    """The evaluate record and the gate's files in the workspace ``root`` (resolved), with its state.

    ``state``: ``not run`` (no finished record), ``skipped`` (no eval set), ``passed`` (``quality/``),
    ``refused`` (a verdict in ``failed/evaluate/``) or ``failed`` (an error before any verdict).
    """
    ws = Workspace(root)
    record = ws.step(QUALITY_STEP)
    status = (record or {}).get("status")
    found: dict[str, Any] = {"record": record, "evaluation": None, "plot": None, "bad_cases": None}
    if status not in ("ok", "failed"):
        return found | {"state": "not run"}
    directory = ws.path(OUT_DIRS[QUALITY_STEP]) if status == "ok" else ws.failed_dir(QUALITY_STEP)
    found |= {k: _confined(directory, rel, root) for k, rel in (("plot", QUALITY_PLOT), ("bad_cases", BAD_CASES))}
    evaluation = found["evaluation"] = _read_json(_confined(directory, EVALUATION, root))
    scored = bool(evaluation and isinstance(evaluation.get("candidate"), dict))
    if status == "ok":
        state = "passed" if scored or evaluation is None else "skipped"
    else:
        state = "refused" if scored else "failed"
    return found | {"state": state}


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    return str(value) if isinstance(value, int) else ("NaN" if math.isnan(value) else f"{value:.4f}")


def _delta(candidate: Any, champion: Any) -> tuple[float | None, str]:
    """candidate − champion and its cell (red when worse, green when better; — when either is missing)."""
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (candidate, champion))
    if not numbers or math.isnan(candidate - champion):
        return None, "<td class='n muted'>—</td>"
    d = float(candidate - champion)
    kind = "worse" if d < -1e-9 else "better" if d > 1e-9 else "same"
    return d, f"<td class='n {kind}'>{d:+.4f}</td>" if kind != "same" else "<td class='n same'>0</td>"


def _champion_name(evaluation: dict[str, Any]) -> str:
    version = evaluation.get("champion_version")
    return f"champion (Triton v{version})" if version is not None else "champion (none: first release)"


def _context(dag_id: str, run_id: str, evaluation: dict[str, Any]) -> str:
    e = html.escape
    facts = [("DAG", dag_id), ("run", run_id), ("model", evaluation.get("model_name"))]
    facts += [("fingerprint", str(evaluation.get("fingerprint") or "")[:16]), ("profile", evaluation.get("profile"))]
    shown = ", ".join(f"{label} <code>{e(str(v))}</code>" for label, v in facts if v)
    return f"<p>{shown}</p>"


def _failures_table(failures: list[Any]) -> str:
    e, rows = html.escape, []
    for f in (f for f in failures if isinstance(f, dict)):
        fp32 = f.get("rule") == "max_profile_f1_drop"  # that rule's baseline is the fp32 graph, not the champion
        champion = _number(f.get("champion")) + (" (fp32 graph)" if fp32 else "")
        if f.get("champion") is None:
            champion = "— (a floor)"
        rows.append(
            f"<tr><td>{e(str(f.get('rule')))}</td><td>{e(str(f.get('metric')))}</td>"
            f"<td class='n'>{_number(f.get('candidate'))}</td><td class='n'>{e(champion)}</td>"
            f"<td class='n'>{_number(f.get('threshold'))}</td></tr>"
        )
    head = "<tr><th>rule</th><th>metric</th><th>candidate</th><th>champion</th><th>threshold</th></tr>"
    return f"<table class='failures'>{head}{''.join(rows)}</table>" if rows else ""


def _verdict(found: dict[str, Any]) -> str:
    """The answer first: passed / refused (each failed rule) / skipped / did not run / failed."""
    e, state = html.escape, found["state"]
    record, evaluation = found["record"] or {}, found["evaluation"] or {}
    title = {
        "passed": "Quality gate passed",
        "refused": "Quality gate REFUSED the candidate",
        "skipped": "Quality gate skipped",
        "not run": "Quality gate did not run",
        "failed": "Quality gate FAILED before its verdict",
    }[state]
    parts = [f"<h1 class='{e(state.replace(' ', '-'))}'>{e(title)}</h1>"]
    skipped = [str(s) for s in evaluation.get("skipped") or []]
    if state == "not run":
        parts.append(
            "<p>The release's workspace has no finished <code>evaluate_quality</code> record: the task has not "
            "run for this release yet, or an earlier task failed.</p>"
        )
    elif state == "skipped":
        why = skipped or [str((record.get("summary") or {}).get("skipped") or "no eval set")]
        parts += [f"<p class='skipped'>skipped: {e(w)}</p>" for w in why]
        return "".join(parts)
    elif state == "failed":
        parts.append(f"<pre style='white-space:pre-wrap'>{e(str(record.get('error') or ''))}</pre>")
    checks = evaluation.get("checks")
    if state == "passed" and isinstance(checks, list):  # its summary repeats the skipped rules listed below
        parts.append(f"<p>{len(checks)} check{'' if len(checks) == 1 else 's'} passed.</p>")
    elif evaluation.get("summary"):
        parts.append(f"<p>{e(str(evaluation['summary']))}</p>")
    parts.append(_failures_table(evaluation.get("failures") or []))
    if state == "refused" and record.get("error"):
        refusal = f"<pre style='white-space:pre-wrap'>{e(str(record['error']))}</pre>"
        parts.append(f"<details><summary>The refusal as the task logged it</summary>{refusal}</details>")
    if state == "passed" and not evaluation:
        parts.append(f"<p class='muted'>{e(EVALUATION)} is missing from the workspace.</p>")
    parts += [f"<p class='skipped'>• {e(s)}</p>" for s in skipped]
    return "".join(parts)


def _headline_rows(evaluation: dict[str, Any]) -> list[tuple[str, Any, Any, Any]]:
    """(what, candidate, champion, fp32) per headline metric, then micro/macro-F1 per level."""
    scores = [
        evaluation.get(who) if isinstance(evaluation.get(who), dict) else {}
        for who in ("candidate", "champion", "fp32")
    ]
    rows = [(label, *(s.get(key) for s in scores)) for key, label in HEADLINE]
    levels = sorted({str(lv) for s in scores for lv in (s.get("per_level") or {})}, key=lambda v: (len(v), v))
    for level in levels:
        for key, label in (("micro_f1", "micro-F1"), ("macro_f1", "macro-F1")):
            rows.append(
                (f"level {level} {label}", *((s.get("per_level") or {}).get(level, {}).get(key) for s in scores))
            )
    return rows


def _headline_table(evaluation: dict[str, Any]) -> str:
    e, fp32 = html.escape, isinstance(evaluation.get("fp32"), dict)
    head = f"<tr><th>metric</th><th>candidate</th><th>{e(_champion_name(evaluation))}</th><th>Δ</th>"
    head += "<th>fp32 graph</th></tr>" if fp32 else "</tr>"
    body = []
    for label, cand, champ, full in _headline_rows(evaluation):
        extra = f"<td class='n'>{_number(full)}</td>" if fp32 else ""
        cells = f"<td class='n'>{_number(cand)}</td><td class='n'>{_number(champ)}</td>{_delta(cand, champ)[1]}"
        body.append(f"<tr><th align='left'>{e(label)}</th>{cells}{extra}</tr>")
    texts = (evaluation.get("candidate") or {}).get("texts")
    title = f"<h2>Candidate vs champion on {e(_number(texts))} texts</h2>"
    return f"{title}<table class='headline'>{head}{''.join(body)}</table>"


def _label_rows(evaluation: dict[str, Any]) -> list[tuple[float | None, str, Any, Any, Any, str]]:
    """(Δ, label, support, candidate F1, champion F1, Δ cell), worst Δ first; no champion: lowest F1 first."""
    cand = (evaluation.get("candidate") or {}).get("per_label") or {}
    champ = (evaluation.get("champion") or {}).get("per_label") or {}
    rows = []
    for label in dict.fromkeys([*cand, *champ]):
        c, ch = cand.get(label) or {}, champ.get(label) or {}
        if not any((c.get("support"), c.get("predicted"), ch.get("support"), ch.get("predicted"))):
            continue  # in neither the gold sets nor any prediction: says nothing about either model
        d, cell = _delta(c.get("f1"), ch.get("f1"))
        rows.append((d, str(label), c.get("support", ch.get("support")), c.get("f1"), ch.get("f1"), cell))

    def worst_first(row: tuple) -> tuple:
        d, label, _support, f1 = row[:4]
        f1 = f1 if isinstance(f1, int | float) else math.inf
        return (d is None, d if d is not None else f1, label)

    return sorted(rows, key=worst_first)


def _label_table(evaluation: dict[str, Any]) -> str:
    e, rows = html.escape, _label_rows(evaluation)
    champion = e(_champion_name(evaluation))
    head = f"<tr><th>label</th><th>support</th><th>candidate F1</th><th>{champion} F1</th><th>Δ</th></tr>"
    body = "".join(
        f"<tr><td>{e(label)}</td><td class='n'>{_number(support)}</td><td class='n'>{_number(c)}</td>"
        f"<td class='n'>{_number(ch)}</td>{cell}</tr>"
        for _d, label, support, c, ch, cell in rows
    )
    return f"<h2>Per label ({len(rows)}), worst Δ first</h2><table class='labels'>{head}{body}</table>"


def _eval_set(evaluation: dict[str, Any]) -> str:
    e, es = html.escape, evaluation.get("eval_set") or {}
    sha = str(es.get("sha256") or "")
    rows = [
        ("path", f"<code>{e(str(es.get('path', '')))}</code>"),
        ("texts", e(_number(es.get("texts")))),
        ("sha256", f"<code title='{e(sha)}'>{e(sha[:12])}</code>"),
        ("format", e(str(es.get("format", "")))),
        ("came from", e(str(es.get("source", "")))),
    ]
    disagree = evaluation.get("champion_disagreements")
    if isinstance(disagree, int):
        rows.append(("label sets differing from the champion's", e(str(disagree))))
    cells = "".join(f"<tr><th align='left'>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f"<h2>Eval set</h2><table class='evalset'>{cells}</table>"


def _checks(evaluation: dict[str, Any]) -> str:
    """Every check the gate made, folded: what passed is evidence too."""
    e, checks = html.escape, [c for c in evaluation.get("checks") or [] if isinstance(c, dict)]
    if not checks:
        return ""
    rows = "".join(
        f"<tr><td>{e(str(c.get('rule')))}</td><td>{e(str(c.get('metric')))}</td>"
        f"<td class='n'>{_number(c.get('candidate'))}</td><td class='n'>{_number(c.get('champion'))}</td>"
        f"<td class='n'>{_number(c.get('threshold'))}</td><td>{'passed' if c.get('passed') else 'FAILED'}</td></tr>"
        for c in checks
    )
    head = "<tr><th>rule</th><th>metric</th><th>candidate</th><th>baseline</th><th>threshold</th><th></th></tr>"
    return f"<details><summary>All {len(checks)} checks</summary><table>{head}{rows}</table></details>"


def render_quality(dag_id: str, run_id: str, found: dict[str, Any], mlflow_url: str | None, base: str) -> str:
    """The quality page; ``base`` is the run's segment, so ``{base}/labels.png`` resolves under the page."""
    e, evaluation = html.escape, found["evaluation"] or {}
    parts = [_head(f"Quality evidence — {run_id}"), _verdict(found), _context(dag_id, run_id, evaluation)]
    if isinstance(evaluation.get("candidate"), dict):
        parts += [_headline_table(evaluation), _checks(evaluation), _eval_set(evaluation), _label_table(evaluation)]
    if found["plot"]:
        parts.append(f"<p><img alt='F1 per label' src='{e(base)}/labels.png' style='max-width:100%'></p>")
    if found["bad_cases"]:
        count = evaluation.get("bad_cases")
        what = f" — {e(_number(count))} texts the candidate got wrong" if isinstance(count, int) else ""
        parts.append(f"<p><a href='{e(base)}/bad_cases.tsv'>bad_cases.tsv</a>{what}</p>")
    parts.append(_mlflow_line(found["record"] or {}, mlflow_url))
    return "".join(parts) + "</body></html>"


def _quality_routes(
    app: FastAPI,
    root_of: Callable[[str, str, str], tuple[Path, Settings]],
    run_url: Callable[[Settings, Any], str | None],
) -> None:
    """``/quality/{dag_id}/{run_id}`` and its ``labels.png`` and ``bad_cases.tsv`` (behind the same access check)."""
    headers = {"Content-Security-Policy": PAGE_CSP, "X-Content-Type-Options": "nosniff"}

    def found_for(dag_id: str, run_id: str) -> tuple[dict[str, Any], Settings]:
        root, cfg = root_of(dag_id, run_id, "quality")
        return quality_evidence(root), cfg

    @app.get("/quality/{dag_id}/{run_id}", response_class=HTMLResponse, dependencies=[Depends(authorized)])
    def quality_page(dag_id: str, run_id: str) -> HTMLResponse:
        found, cfg = found_for(dag_id, run_id)
        url = run_url(cfg, (found["record"] or {}).get("mlflow_run_id"))
        return HTMLResponse(render_quality(dag_id, run_id, found, url, quote(run_id, safe="")), headers=headers)

    def evidence_file(dag_id: str, run_id: str, key: str) -> Path:
        path = found_for(dag_id, run_id)[0][key]
        if path is None:
            raise HTTPException(404, f"no quality gate {key.replace('_', ' ')} for run {run_id!r} of DAG {dag_id!r}")
        return path

    @app.get("/quality/{dag_id}/{run_id}/labels.png", dependencies=[Depends(authorized)])
    def quality_plot(dag_id: str, run_id: str) -> Response:
        return Response(evidence_file(dag_id, run_id, "plot").read_bytes(), media_type="image/png", headers=headers)

    @app.get("/quality/{dag_id}/{run_id}/bad_cases.tsv", dependencies=[Depends(authorized)])
    def quality_bad_cases(dag_id: str, run_id: str) -> Response:
        text = evidence_file(dag_id, run_id, "bad_cases").read_text(encoding="utf-8", errors="replace")
        return PlainTextResponse(text, headers=headers | {"Content-Disposition": 'inline; filename="bad_cases.tsv"'})


def create_app(
    lookup: Lookup | None = None, settings=None, *, experiment_of: Callable[[str], str | None] | None = None
) -> FastAPI:
    """The app; ``lookup``/``settings``/``experiment_of`` are injectable (tests; defaults: the database,
    the environment's settings, the MLflow server)."""
    app = FastAPI(title="seqcls", docs_url=None, redoc_url=None, openapi_url=None)

    def root_of(dag_id: str, run_id: str, what: str) -> tuple[Path, Settings]:
        cfg = settings or Settings.from_env()
        ref = (lookup or resolved_release)(dag_id, run_id)
        root = workspace_of(ref, cfg) if ref else None
        if root is None:
            raise HTTPException(404, f"no {what} evidence for run {run_id!r} of DAG {dag_id!r}")
        return root, cfg

    def run_url(cfg: Settings, mlflow_run: Any) -> str | None:
        uri = str(cfg.mlflow_tracking_uri)
        return mlflow_run_url(uri, mlflow_run, experiment_of or _experiment_of(uri))

    def find(dag_id: str, run_id: str) -> dict[str, Any]:
        root, cfg = root_of(dag_id, run_id, "parity")
        found = evidence(root)
        if found is None:
            raise HTTPException(404, f"no parity evidence for run {run_id!r} of DAG {dag_id!r}")
        return found | {"settings": cfg}

    @app.exception_handler(HTTPException)
    async def _text(_request: Request, exc: HTTPException) -> Response:
        return PlainTextResponse(str(exc.detail), status_code=exc.status_code)

    @app.get("/parity/{dag_id}/{run_id}", response_class=HTMLResponse, dependencies=[Depends(authorized)])
    def page(dag_id: str, run_id: str) -> str:
        found = find(dag_id, run_id)
        link = run_url(found["settings"], found["record"].get("mlflow_run_id"))
        # relative to .../parity/{dag_id}/{run_id} (no trailing slash): resolves to .../{run_id}/plot.png
        return render(dag_id, run_id, found, link, f"{quote(run_id, safe='')}/plot.png")

    @app.get("/parity/{dag_id}/{run_id}/plot.png", dependencies=[Depends(authorized)])
    def plot(dag_id: str, run_id: str) -> Response:
        found = find(dag_id, run_id)
        if not found["plot"]:
            raise HTTPException(404, f"no parity plot for run {run_id!r} of DAG {dag_id!r}")
        return Response(found["plot"].read_bytes(), media_type="image/png")

    _quality_routes(app, root_of, run_url)
    return app


__all__ = [
    "URL_PREFIX",
    "authorized",
    "create_app",
    "evidence",
    "evidence_path",
    "quality_evidence",
    "quality_path",
    "render",
    "render_quality",
    "resolved_release",
]
