"""The parity evidence page behind the ``Parity evidence`` extra link of ``validate_parity``.

A FastAPI app the plugin mounts in the API server under ``/seqcls`` (:data:`URL_PREFIX`):
``GET /seqcls/parity/{dag_id}/{run_id}`` shows the gate's outcome, the report's figures, the
plot inline and the MLflow run — for a passed gate (``parity/``) and for a failed one
(``failed/validate/``), whose task pushed no XCom. The release is found from what
``resolve_checkpoint`` returned for that run (model, fingerprint), its workspace is recomputed
from the settings (:func:`seqcls.workspace.workspace_dir`) and only read. No part of the request
names a file: the plot's path is the layout's own (:data:`seqcls.records.PARITY_PLOT`).

Access: the same login as the UI (the ``_token`` cookie or a bearer token) and read access to the
DAG's task instances, through Airflow's own API dependencies (imported when a request comes).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from seqcls.airflow.context import RESOLVE_TASK
from seqcls.airflow.report import pushed_value
from seqcls.records import OUT_DIRS, PARITY_PLOT, PARITY_REPORT
from seqcls.settings import Settings
from seqcls.workspace import Workspace, workspace_dir

URL_PREFIX = "/seqcls"
_FINGERPRINT = re.compile(r"^[0-9a-f]{16,128}$")
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

#: (dag_id, run_id) → what resolve_checkpoint returned (model_name, fingerprint, ...) or None.
Lookup = Callable[[str, str], "dict[str, Any] | None"]


def evidence_path(dag_id: str, run_id: str) -> str:
    """The page's path under the API server (ids URL-encoded: run ids hold ``:`` and ``+``)."""
    return f"{URL_PREFIX}/parity/{quote(dag_id, safe='')}/{quote(run_id, safe='')}"


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


def render(dag_id: str, run_id: str, found: dict[str, Any], mlflow_url: str | None, plot_src: str) -> str:
    e = html.escape
    record, report = found["record"], found["report"] or {}
    outcome = "passed" if found["passed"] else "FAILED"
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Parity evidence — {e(run_id)}</title></head>",
        "<body style='font-family:sans-serif'>",
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
    run = record.get("mlflow_run_id")
    if mlflow_url:
        parts.append(f"<p><a href='{e(mlflow_url)}'>MLflow run {e(run)}</a></p>")
    elif run:
        parts.append(f"<p>MLflow run <code>{e(run)}</code></p>")
    return "".join(parts) + "</body></html>"


def create_app(
    lookup: Lookup | None = None, settings=None, *, experiment_of: Callable[[str], str | None] | None = None
) -> FastAPI:
    """The app; ``lookup``/``settings``/``experiment_of`` are injectable (tests; defaults: the database,
    the environment's settings, the MLflow server)."""
    app = FastAPI(title="seqcls", docs_url=None, redoc_url=None, openapi_url=None)

    def find(dag_id: str, run_id: str) -> dict[str, Any]:
        cfg = settings or Settings.from_env()
        ref = (lookup or resolved_release)(dag_id, run_id)
        root = workspace_of(ref, cfg) if ref else None
        found = evidence(root) if root else None
        if found is None:
            raise HTTPException(404, f"no parity evidence for run {run_id!r} of DAG {dag_id!r}")
        found["settings"] = cfg
        return found

    @app.exception_handler(HTTPException)
    async def _text(_request: Request, exc: HTTPException) -> Response:
        return PlainTextResponse(str(exc.detail), status_code=exc.status_code)

    @app.get("/parity/{dag_id}/{run_id}", response_class=HTMLResponse, dependencies=[Depends(authorized)])
    def page(dag_id: str, run_id: str) -> str:
        found = find(dag_id, run_id)
        uri = str(found["settings"].mlflow_tracking_uri)
        run_url = mlflow_run_url(uri, found["record"].get("mlflow_run_id"), experiment_of or _experiment_of(uri))
        # relative to .../parity/{dag_id}/{run_id} (no trailing slash): resolves to .../{run_id}/plot.png
        return render(dag_id, run_id, found, run_url, f"{quote(run_id, safe='')}/plot.png")

    @app.get("/parity/{dag_id}/{run_id}/plot.png", dependencies=[Depends(authorized)])
    def plot(dag_id: str, run_id: str) -> Response:
        found = find(dag_id, run_id)
        if not found["plot"]:
            raise HTTPException(404, f"no parity plot for run {run_id!r} of DAG {dag_id!r}")
        return Response(found["plot"].read_bytes(), media_type="image/png")

    return app


__all__ = ["URL_PREFIX", "authorized", "create_app", "evidence", "evidence_path", "render", "resolved_release"]
