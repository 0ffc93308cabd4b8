"""The seqcls pages of the API server: the gates' evidence and the serving history.

A FastAPI app the plugin mounts in the API server under ``/seqcls`` (:data:`URL_PREFIX`):

- ``GET /seqcls/parity/{dag_id}/{run_id}`` — ``validate_parity``: the verdict and its reasons, the key
  figures (tokenizer ids, logits and probabilities against their tolerances, decisions kept), the
  plot, then every figure; the decision thresholds folded — for a passed gate (``parity/``) and a
  failed one (``failed/validate/``), whose task pushed no XCom;
- ``GET /seqcls/quality/{dag_id}/{run_id}`` — ``evaluate_quality``: the verdict (each failed rule with
  both values), candidate beside champion, ``labels.png``, then per label, the eval set,
  ``bad_cases.tsv`` and every check folded — passed, refused, skipped or not run;
- ``GET /seqcls/history`` and ``/seqcls/history/{model}`` — :func:`seqcls.ops.history.history` as a table
  (what ``seqcls history --json`` prints), each change linked to its Airflow run and evidence.

Every page starts with links: the Airflow run (its grid view), the MLflow run, the other gate's page,
the model's history. Links between Airflow's and these pages are relative (``../../../dags/...``),
so they hold under any ``[api] base_url`` sub-path. The MLflow link comes from the run's *own* MLflow
Connection (its ``mlflow_conn_id`` param, resolved by :class:`~seqcls.airflow.hooks.MlflowHook`, as the
run's tasks resolved it) — never the API server's environment alone — and exists only for an http(s)
tracking server (a sqlite store has no UI). The history reads the model repository of the model's
Triton Connection (its release DAG's ``triton_conn_id``).

A release is found from what ``resolve_checkpoint`` returned for that run (model, fingerprint); its
workspace is recomputed from the settings (:func:`seqcls.release.workspace.workspace_dir`) and only read. No
part of a request names a file: each file's path is the layout's own (:mod:`seqcls.release.records`) and must
resolve inside the workspace. The HTML is :mod:`seqcls.airflow.pages`'.

Access: the same login as the UI (the ``_token`` cookie or a bearer token) and read access to the
DAG's task instances (the model's release DAG for its history), through Airflow's own API
dependencies (imported when a request comes).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from seqcls.airflow.context import RESOLVE_TASK
from seqcls.airflow.hooks import MlflowHook, TritonHook
from seqcls.airflow.models_file import DAG_ID, dag_id_for
from seqcls.airflow.pages.history import ModelRow, render_history, render_models
from seqcls.airflow.pages.kit import PAGE_CSP, Link
from seqcls.airflow.pages.parity import evidence, render
from seqcls.airflow.pages.quality import quality_evidence, render_quality
from seqcls.airflow.report import pushed_value
from seqcls.contract.names import MODEL_NAME_PATTERN, ModelName
from seqcls.errors import InputError
from seqcls.ops.history import history, read_entries
from seqcls.ops.sync import models_in
from seqcls.registry.ledger import model_version_url
from seqcls.release.workspace import workspace_dir
from seqcls.settings import Settings

log = logging.getLogger("seqcls.airflow")

URL_PREFIX = "/seqcls"
_FINGERPRINT = re.compile(r"^[0-9a-f]{16,128}$")
_MODEL = re.compile(MODEL_NAME_PATTERN)
HEADERS = {"Content-Security-Policy": PAGE_CSP, "X-Content-Type-Options": "nosniff"}

#: (dag_id, run_id) → what resolve_checkpoint returned (model_name, fingerprint, ...) or None.
Lookup = Callable[[str, str], "dict[str, Any] | None"]
#: (dag_id, run_id) → the params the run's tasks saw (its DAG's defaults, then its conf).
ParamsOf = Callable[[str, str], "dict[str, Any]"]
#: () → model name → its release DAG's param defaults plus ``dag_id``, for every release DAG Airflow knows.
ReleaseDags = Callable[[], "dict[str, dict[str, Any]]"]


def _q(value: str) -> str:
    return quote(value, safe="")


def evidence_path(dag_id: str, run_id: str) -> str:
    """The parity page's path under the API server (ids URL-encoded: run ids hold ``:`` and ``+``)."""
    return f"{URL_PREFIX}/parity/{_q(dag_id)}/{_q(run_id)}"


def quality_path(dag_id: str, run_id: str) -> str:
    """The quality page's path under the API server (ids URL-encoded like :func:`evidence_path`)."""
    return f"{URL_PREFIX}/quality/{_q(dag_id)}/{_q(run_id)}"


def history_path(model: str | None = None) -> str:
    """The history page of ``model`` (None: the index of every model) under the API server."""
    return f"{URL_PREFIX}/history" + (f"/{_q(model)}" if model else "")


def mlflow_run_url(uri: str | None, run_id: str | None) -> str | None:
    """The MLflow UI's page of ``run_id`` (its ``#/runs/<id>`` route finds the experiment itself); None
    without a run or for a tracking store that has no UI (sqlite, a file store)."""
    if not run_id or not str(uri or "").startswith(("http://", "https://")):
        return None
    return f"{str(uri).rstrip('/')}/#/runs/{_q(str(run_id))}"


# --- what Airflow knows (its metadata database: in the API server only) --------------------------


def resolved_release(dag_id: str, run_id: str) -> dict[str, Any] | None:
    """What ``resolve_checkpoint`` returned for the run, read from the metadata database."""
    from airflow.models.taskinstancekey import TaskInstanceKey  # Airflow core: in the API server only

    value = pushed_value(TaskInstanceKey(dag_id, RESOLVE_TASK, run_id, -1, -1), "return_value")
    return value if isinstance(value, dict) else None


def run_params(dag_id: str, run_id: str) -> dict[str, Any]:
    """The params the run's tasks saw: the defaults of the DAG version it ran, overridden by its conf."""
    from airflow.models.dagbag import DBDagBag  # Airflow core: in the API server only
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        if run is None:
            return {}
        dag = DBDagBag().get_dag_for_run(run, session=session)
        return {**(dict(dag.params) if dag is not None else {}), **dict(run.conf or {})}


def release_dags() -> dict[str, dict[str, Any]]:
    """Model name → its release DAG's param defaults (with ``dag_id``), for every active release DAG."""
    from airflow.models.dag import DagModel  # Airflow core: in the API server only
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session
    from sqlalchemy import or_, select

    release = or_(DagModel.dag_id == DAG_ID, DagModel.dag_id.startswith(f"{DAG_ID}__", autoescape=True))
    out: dict[str, dict[str, Any]] = {}
    with create_session() as session:
        for dag_id in sorted(session.scalars(select(DagModel.dag_id).where(release, DagModel.is_stale.is_(False)))):
            dag = SerializedDagModel.get_dag(dag_id, session=session)
            params = dict(dag.params) if dag is not None else {}
            if isinstance(params.get("model_name"), str):
                out[params["model_name"]] = {**params, "dag_id": dag_id}
    return out


async def authorized(request: Request) -> None:
    """The UI's login + read access to the DAG's task instances (401/403 otherwise): the ``dag_id`` of the
    path, the model's release DAG for a history page, any DAG for the history index."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user, requires_access_dag

    user = await get_user(request, None, await bearer_scheme(request))
    dag_id = request.path_params.get("dag_id")
    model = request.path_params.get("model")
    if dag_id is None and isinstance(model, str):
        dag_id = (release_dags().get(model) or {}).get("dag_id") or dag_id_for(model)
    requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE, param_dag_id=dag_id)(request, user)


# --- the run's settings: its Connections, as its tasks resolved them -----------------------------


def connected_settings(base: Settings, params: dict[str, Any]) -> tuple[Settings, list[str], bool]:
    """``base`` with the model repository of the params' Triton Connection and the tracking URI of their
    MLflow Connection (each unset → ``base``'s, as in the tasks), the notes on a Connection that could not
    be read (the page shows what it can), and whether the MLflow one could."""
    notes: list[str] = []
    changes: dict[str, Any] = {}
    triton_id = str(params.get("triton_conn_id") or TritonHook.default_conn_name)
    mlflow_id = str(params.get("mlflow_conn_id") or MlflowHook.default_conn_name)
    try:
        repository = TritonHook(triton_id).repository
        if repository:
            changes["triton_repository"] = repository
    except Exception as exc:  # a Connection is configuration: the page still shows what it can
        notes.append(f"Triton connection {triton_id!r} could not be read ({exc}); using the API server's settings")
    mlflow_ok = True
    try:
        uri = MlflowHook(mlflow_id).tracking_uri
        if uri:
            changes["mlflow_tracking_uri"] = uri
    except Exception as exc:
        notes.append(f"MLflow connection {mlflow_id!r} could not be read ({exc})")
        mlflow_ok = False
    return replace(base, **changes), notes, mlflow_ok


def mlflow_model_url(uri: str | None, model: str) -> str | None:
    """The MLflow UI's page of the registered model (http(s) tracking servers only)."""
    if not str(uri or "").startswith(("http://", "https://")):
        return None
    return f"{str(uri).rstrip('/')}/#/models/{_q(model)}"


def run_links(dag_id: str, run_id: str, model: str, *, here: str) -> list[Link]:
    """The links bar of a gate's page (``here``: parity or quality), which sits at ``/seqcls/<here>/<dag>/<run>``:
    ``../../../`` is the API server's root, ``../../`` the plugin's."""
    d, r = _q(dag_id), _q(run_id)
    links = [Link("Airflow run", f"../../../dags/{d}/runs/{r}")]
    links += [
        Link(f"{gate.title()} evidence", f"../../{gate}/{d}/{r}") for gate in ("parity", "quality") if gate != here
    ]
    links.append(Link(f"History of {model}", f"../../history/{_q(model)}"))
    return links


def mlflow_link(settings: Settings, mlflow_run: Any, mlflow_ok: bool) -> Link:
    """The MLflow run's link, or why there is none."""
    url = mlflow_run_url(settings.mlflow_tracking_uri, mlflow_run) if mlflow_ok else None
    if url:
        return Link("MLflow run", url)
    if not mlflow_run:
        return Link("MLflow run", note="none recorded")
    why = "the run's MLflow connection could not be read" if not mlflow_ok else "its tracking store has no UI"
    return Link(f"MLflow run {mlflow_run}", note=why)


@dataclass
class RunPage:
    """What a gate's page needs of its run: the workspace, the run's settings, the model, the MLflow state."""

    root: Path
    settings: Settings
    model: str
    notes: list[str]
    mlflow_ok: bool


class _Pages:
    """What the routes share: the injected lookups, and the settings of a run or of a model."""

    def __init__(self, lookup: Lookup, base: Callable[[], Settings], params_of: ParamsOf, dags: ReleaseDags):
        self.lookup, self.base, self.params_of, self.dags = lookup, base, params_of, dags

    def run(self, dag_id: str, run_id: str, what: str) -> RunPage:
        """The run's workspace (404 without one) and its settings."""
        base = self.base()
        ref = self.lookup(dag_id, run_id)
        root = workspace_of(ref, base) if ref else None
        if root is None:
            raise HTTPException(404, f"no {what} evidence for run {run_id!r} of DAG {dag_id!r}")
        settings, notes, mlflow_ok = connected_settings(base, self.params_of(dag_id, run_id))
        return RunPage(root, settings, str(ref.get("model_name")), notes, mlflow_ok)

    def model(self, model: str) -> tuple[Settings, list[str], str | None]:
        """A model's settings (the Connections its release DAG defaults to), notes and DAG id."""
        params = self.dags().get(model) or {}
        settings, notes, _ = connected_settings(self.base(), params)
        repository = Path(str(settings.triton_repository))
        if not repository.is_dir():
            notes.append(f"the model repository {repository} is not readable from the API server")
        return settings, notes, params.get("dag_id")


def workspace_of(ref: dict[str, Any], settings: Settings) -> Path | None:
    """The release's workspace, from the resolved model + fingerprint, confined to the releases dir."""
    text, fingerprint = str(ref.get("model_name") or ""), str(ref.get("fingerprint") or "")
    if not _MODEL.match(text) or not _FINGERPRINT.match(fingerprint):
        return None
    try:
        model = ModelName(text)  # from XCom: where it enters this page
    except InputError:
        return None
    releases = Path(settings.releases_dir).resolve()
    root = workspace_dir(settings, model, fingerprint).resolve()
    return root if root.is_relative_to(releases) and root.is_dir() else None


def _parity_routes(app: FastAPI, pages: _Pages) -> None:
    def find(dag_id: str, run_id: str) -> tuple[dict[str, Any], RunPage]:
        run = pages.run(dag_id, run_id, "parity")
        found = evidence(run.root)
        if found is None:
            raise HTTPException(404, f"no parity evidence for run {run_id!r} of DAG {dag_id!r}")
        return found, run

    @app.get("/parity/{dag_id}/{run_id}", response_class=HTMLResponse, dependencies=[Depends(authorized)])
    def parity_page(dag_id: str, run_id: str) -> HTMLResponse:
        found, run = find(dag_id, run_id)
        links = run_links(dag_id, run_id, run.model, here="parity")
        links.append(mlflow_link(run.settings, found["record"].get("mlflow_run_id"), run.mlflow_ok))
        # relative to .../parity/{dag_id}/{run_id} (no trailing slash): resolves to .../{run_id}/plot.png
        plot = f"{_q(run_id)}/plot.png"
        text = render(found, dag_id=dag_id, run_id=run_id, links=links, plot_src=plot, model=run.model)
        return HTMLResponse(text, headers=HEADERS)

    @app.get("/parity/{dag_id}/{run_id}/plot.png", dependencies=[Depends(authorized)])
    def parity_plot(dag_id: str, run_id: str) -> Response:
        found = find(dag_id, run_id)[0]
        if not found["plot"]:
            raise HTTPException(404, f"no parity plot for run {run_id!r} of DAG {dag_id!r}")
        return Response(found["plot"].read_bytes(), media_type="image/png", headers=HEADERS)


def _quality_routes(app: FastAPI, pages: _Pages) -> None:
    """``/quality/{dag_id}/{run_id}`` and its ``labels.png`` and ``bad_cases.tsv`` (behind the same access check)."""

    def found_for(dag_id: str, run_id: str) -> tuple[dict[str, Any], RunPage]:
        run = pages.run(dag_id, run_id, "quality")
        return quality_evidence(run.root), run

    @app.get("/quality/{dag_id}/{run_id}", response_class=HTMLResponse, dependencies=[Depends(authorized)])
    def quality_page(dag_id: str, run_id: str) -> HTMLResponse:
        found, run = found_for(dag_id, run_id)
        links = run_links(dag_id, run_id, run.model, here="quality")
        links.append(mlflow_link(run.settings, (found["record"] or {}).get("mlflow_run_id"), run.mlflow_ok))
        text = render_quality(found, dag_id=dag_id, run_id=run_id, links=links, base=_q(run_id), model=run.model)
        return HTMLResponse(text, headers=HEADERS)

    def evidence_file(dag_id: str, run_id: str, key: str) -> Path:
        path = found_for(dag_id, run_id)[0][key]
        if path is None:
            raise HTTPException(404, f"no quality gate {key.replace('_', ' ')} for run {run_id!r} of DAG {dag_id!r}")
        return path

    @app.get("/quality/{dag_id}/{run_id}/labels.png", dependencies=[Depends(authorized)])
    def quality_plot(dag_id: str, run_id: str) -> Response:
        return Response(evidence_file(dag_id, run_id, "plot").read_bytes(), media_type="image/png", headers=HEADERS)

    @app.get("/quality/{dag_id}/{run_id}/bad_cases.tsv", dependencies=[Depends(authorized)])
    def quality_bad_cases(dag_id: str, run_id: str) -> Response:
        text = evidence_file(dag_id, run_id, "bad_cases").read_text(encoding="utf-8", errors="replace")
        return PlainTextResponse(text, headers=HEADERS | {"Content-Disposition": 'inline; filename="bad_cases.tsv"'})


def _model_names(dags: dict[str, dict[str, Any]]) -> list[ModelName]:
    """The model names Airflow's release DAGs carry (their ``model_name`` param), checked where they enter."""
    out = []
    for name in dags:
        try:
            out.append(ModelName(name))
        except InputError:
            log.warning("a release DAG's model_name %r is not a model name: not listed", name)
    return out


def _history_routes(app: FastAPI, pages: _Pages) -> None:
    """``/history`` (every model: Airflow's release DAGs and the repository's logs) and ``/history/{model}``
    (its changes joined with MLflow); pages at ``/seqcls/history[/<model>]``."""

    @app.get("/history", response_class=HTMLResponse, dependencies=[Depends(authorized)])
    def history_index() -> HTMLResponse:
        dags = pages.dags()
        base, notes, _ = connected_settings(pages.base(), {})
        repository = Path(str(base.triton_repository))
        names = set(_model_names(dags)) | (set(models_in(repository)) if repository.is_dir() else set())
        rows = []
        for name in sorted(names):
            settings, model_notes, dag_id = pages.model(name)
            entries, _damaged = read_entries(Path(str(settings.triton_repository)), name)
            rows.append(ModelRow(name, dag_id, entries, "; ".join(model_notes)))
        text = render_models(rows, links=[Link("Airflow", "../")], notes=notes, page_of=lambda m: f"history/{_q(m)}")
        return HTMLResponse(text, headers=HEADERS)

    @app.get("/history/{model}", response_class=HTMLResponse, dependencies=[Depends(authorized)])
    def history_page(model: str) -> HTMLResponse:
        if not _MODEL.match(model):
            raise HTTPException(404, f"no model {model!r}")
        settings, notes, dag_id = pages.model(model)
        try:
            result = history(settings, [model])
        except InputError as exc:
            raise HTTPException(404, str(exc)) from exc
        result.notes[:0] = notes
        links = [Link("All models", "../history")]
        links.append(Link("Release DAG", f"../../dags/{_q(dag_id)}") if dag_id else Link("Release DAG", note="none"))
        url = mlflow_model_url(settings.mlflow_tracking_uri, model)
        links.append(Link("MLflow model", url) if url else Link("MLflow model", note="its tracking store has no UI"))

        def runs(d: str, r: str) -> tuple[str, str, str]:
            return f"../../dags/{_q(d)}/runs/{_q(r)}", f"../parity/{_q(d)}/{_q(r)}", f"../quality/{_q(d)}/{_q(r)}"

        def version(v: int) -> str | None:
            return model_version_url(settings, model, v)

        text = render_history(model, result, links=links, run_links=runs, mlflow_version=version)
        return HTMLResponse(text, headers=HEADERS)


def create_app(
    lookup: Lookup | None = None,
    settings: Settings | None = None,
    *,
    params_of: ParamsOf | None = None,
    dags: ReleaseDags | None = None,
) -> FastAPI:
    """The app; ``lookup``/``settings``/``params_of``/``dags`` are injectable (tests; defaults: the
    metadata database and the API server's environment settings)."""
    app = FastAPI(title="seqcls", docs_url=None, redoc_url=None, openapi_url=None)
    pages = _Pages(
        lookup or resolved_release,
        (lambda: settings) if settings is not None else Settings.from_env,
        params_of or run_params,
        dags or release_dags,
    )

    @app.exception_handler(HTTPException)
    async def _text(_request: Request, exc: HTTPException) -> Response:
        return PlainTextResponse(str(exc.detail), status_code=exc.status_code, headers=HEADERS)

    _parity_routes(app, pages)
    _quality_routes(app, pages)
    _history_routes(app, pages)
    return app


__all__ = [
    "URL_PREFIX",
    "authorized",
    "connected_settings",
    "create_app",
    "evidence_path",
    "history_path",
    "mlflow_model_url",
    "mlflow_run_url",
    "quality_path",
    "release_dags",
    "resolved_release",
    "run_params",
]
