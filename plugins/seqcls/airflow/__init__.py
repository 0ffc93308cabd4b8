"""The seqcls side of the Airflow integration: DAG params → library objects, and task summaries.

``dags/seqcls_release.py`` is a thin shell: every task turns its params into
:class:`~seqcls.settings.Settings` + :class:`~seqcls.config.ReleaseConfig`, re-opens the release
workspace (deterministic, so no XCom is needed to find it) and calls one library step. The
helpers here do that mapping and nothing else; release logic stays in the step modules.

This module imports nothing from Airflow, so the heavy Paddle tasks can call it from another
interpreter (``@task.external_python``) where Airflow may not be installed. Connections are read
through :mod:`seqcls.airflow.hooks` (imported lazily, only by :func:`task_settings`), and the UI
links live in :mod:`seqcls.airflow.plugin`.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from seqcls.airflow.roots import LATEST, locate_checkpoint, model_root, refuse_root_param
from seqcls.config import ReleaseConfig
from seqcls.errors import CheckpointError, InputError
from seqcls.settings import DEFAULT_MODEL_NAME, Settings, scoped_environ
from seqcls.steps import BY_NAME, STEPS

log = logging.getLogger("seqcls.airflow")

#: DAG task id → the manifest step it runs (in order), derived from the step table.
#: ``resolve_checkpoint`` opens the workspace; ``rollback`` runs only after a failure.
TASK_STEPS: dict[str, str] = {s.task_id: s.name for s in STEPS}
RESOLVE_TASK = "resolve_checkpoint"
ROLLBACK_TASK = BY_NAME["rollback"].task_id
TASK_ORDER: tuple[str, ...] = (RESOLVE_TASK, *TASK_STEPS, ROLLBACK_TASK)
#: Tasks whose failure leaves something to undo on the servers or in the registry.
ROLLBACK_ON: tuple[str, ...] = tuple(s.task_id for s in STEPS if s.undo_on_failure)

#: DAG params that are not release parameters (they pick a checkpoint, a runtime, connections...).
#: Not among them: the checkpoints root, which the deployment sets (``seqcls.airflow.roots``).
NON_RELEASE_PARAMS = frozenset({"checkpoint", "runtime", "triton_conn_id", "mlflow_conn_id", "skip_if_champion"})
RELEASE_PARAMS = frozenset(f.name for f in fields(ReleaseConfig))

#: XCom keys holding URLs the UI shows as task extra links (see ``seqcls.airflow.plugin``).
MLFLOW_URL_KEY = "seqcls_mlflow_url"
TRITON_URL_KEY = "seqcls_triton_url"


def as_params(params: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """Params as a plain dict (a Mapping from the context, or JSON rendered by a template)."""
    if params is None:
        return {}
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except ValueError as exc:
            raise InputError(f"DAG params are not valid JSON ({exc}): {params[:200]!r}") from exc
    if not isinstance(params, Mapping):
        raise InputError(f"DAG params must be a mapping, got {type(params).__name__}")
    return {k: params[k] for k in params}


def config_from_params(params: Mapping[str, Any] | str | None) -> ReleaseConfig:
    """The validated release config; a bad value raises InputError naming the param."""
    values = as_params(params)
    refuse_root_param(values)
    unknown = sorted(set(values) - RELEASE_PARAMS - NON_RELEASE_PARAMS)
    if unknown:
        raise InputError(f"unknown DAG param(s): {', '.join(unknown)}")
    for name in [k for k, v in values.items() if v == "" and k in RELEASE_PARAMS]:
        values[name] = None  # an emptied optional field in the trigger form
    thresholds = values.get("thresholds")
    if isinstance(thresholds, str):  # the trigger form may send an object as JSON text
        try:
            values["thresholds"] = json.loads(thresholds) if thresholds.strip() else {}
        except ValueError as exc:
            raise InputError(f"thresholds must be a JSON object label -> threshold ({exc})") from exc
    return ReleaseConfig.from_dict({k: v for k, v in values.items() if k in RELEASE_PARAMS})


def settings_from_params(
    params: Mapping[str, Any] | str | None, *, checkpoints_root: str | Path | None = None, **overrides: Any
) -> Settings:
    """Settings from the environment + the ``runtime`` param (no Airflow Connections).

    ``checkpoints_root``: the model's root as the DAG file got it from the models file (absolute, or
    relative to ``SEQCLS_CHECKPOINTS_ROOT``; empty = that root itself) — never from a param.
    """
    values = as_params(params)
    refuse_root_param(values)
    settings = Settings.from_env(runtime=values.get("runtime") or None, **overrides)
    if checkpoints_root is None:
        return settings
    return replace(settings, checkpoints_root=model_root(checkpoints_root, Path(str(settings.checkpoints_root))))


@contextlib.contextmanager
def connected(params: Mapping[str, Any] | str | None, *, checkpoints_root: str | None = None) -> Iterator[Settings]:
    """Settings for a task that talks to Triton or MLflow — the param-named Connections win — with the
    MLflow Connection's credentials in MLflow's own variables for the block (``scoped_environ``)."""
    from seqcls.airflow.hooks import MlflowHook, TritonHook

    values = as_params(params)
    triton = TritonHook(values.get("triton_conn_id") or TritonHook.default_conn_name)
    mlflow = MlflowHook(values.get("mlflow_conn_id") or MlflowHook.default_conn_name)
    overrides = {**triton.settings_overrides(), "mlflow_tracking_uri": mlflow.tracking_uri}
    settings = settings_from_params(values, checkpoints_root=checkpoints_root, **overrides)
    with scoped_environ(mlflow.credentials_env()):
        yield settings


def task_settings(params: Mapping[str, Any] | str | None, *, checkpoints_root: str | None = None) -> Settings:
    """:func:`connected`'s settings alone (no credentials in the environment)."""
    with connected(params, checkpoints_root=checkpoints_root) as settings:
        return settings


def open_for_task(
    checkpoint: str | None,
    params: Mapping[str, Any] | str | None,
    settings: Settings | None = None,
    *,
    fingerprint: str | None = None,
    checkpoints_root: str | None = None,
):
    """Re-open the release a run works on: from resolve_checkpoint's XCom, else from params.

    ``checkpoint``/``fingerprint`` are what ``resolve_checkpoint`` resolved (empty under
    ``airflow tasks test``, where the ``checkpoint`` param is used instead); either must be under the
    model's checkpoints root (``settings``', else ``checkpoints_root``). A fingerprint that no longer
    matches means the checkpoint directory changed during the run.
    """
    from seqcls.workspace import open_release

    values = as_params(params)
    settings = settings or settings_from_params(values, checkpoints_root=checkpoints_root)
    config = config_from_params(values)
    path = locate_checkpoint(checkpoint or values.get("checkpoint"), settings)
    release = open_release(path, config, settings)
    if fingerprint and release.checkpoint.fingerprint != fingerprint:
        raise CheckpointError(
            f"{path}: fingerprint is now {release.checkpoint.short_fingerprint}, but this run resolved "
            f"{fingerprint[:16]}: the checkpoint changed during the run; trigger a new run."
        )
    return release


def run_task_step(
    name: str, checkpoint: str, fingerprint: str, params, ti, *, checkpoints_root: str, **kwargs: Any
) -> dict:
    """One DAG task = one library step: settings from Connections, the run's release, the step, its story.

    Serving steps take the model's release lease as this DAG run (kind ``run``), so the run's
    later tasks — separate processes — re-enter it and another run waits.
    """
    from seqcls.serving.control import LeaseContext, lease_context
    from seqcls.steps import step

    run = f"{getattr(ti, 'dag_id', 'dag')}/{getattr(ti, 'run_id', 'run')}"
    with connected(params, checkpoints_root=checkpoints_root) as settings:
        release = open_for_task(checkpoint, params, settings, fingerprint=fingerprint)
        with lease_context(LeaseContext(kind="run", run=run)):
            result = step(name)(release, **kwargs)
    summary = report(result, ti=ti, settings=settings, model_name=release.config.model_name)
    return {**summary, "model_name": release.config.model_name, "fingerprint": release.checkpoint.fingerprint}


def sync_task(params, groups: list[dict[str, Any]] | None = None) -> list[dict]:
    """The seqcls_sync DAG's task: ``seqcls sync`` with the Connections; fails naming what did not converge.

    ``groups`` (from the models file, :func:`seqcls.airflow.models_file.sync_groups`): per Connection
    pair, the models to sync through it (``models`` None = every model of that repository).
    """
    from seqcls.errors import ServingError
    from seqcls.sync import sync

    results = []
    for group in groups or [{}]:
        conns = {k: group[k] for k in ("triton_conn_id", "mlflow_conn_id") if group.get(k)}
        with connected({**as_params(params), **conns}) as settings:
            results += sync(settings, group.get("models"))
    for r in results:
        log.info(
            "sync %s: serving %s, actions %s, registry %s", r.model_name, r.serving, r.actions or "none", r.registry
        )
    failed = [r for r in results if not r.ok]
    if failed:
        raise ServingError(
            "not in sync: " + "; ".join(f"{r.model_name}: {r.errors or r.registry.get('error')}" for r in failed)
        )
    return [r.to_dict() for r in results]


def _figure(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None if value is None else str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and len(value) <= 80:
        return value
    return None


def step_links(result, settings: Settings, model_name: str | None = None) -> dict[str, str]:
    """XCom key → URL for the UI's extra links (MLflow model version, Triton model version)."""
    version = result.summary.get("version")
    model_name = model_name or result.summary.get("model_name") or DEFAULT_MODEL_NAME
    urls: dict[str, str | None] = {}
    if result.step in ("register", "promote"):
        urls[MLFLOW_URL_KEY] = mlflow_version_url(settings, model_name, version)
    elif result.step in ("publish", "reload", "smoke", "expose"):  # the steps that name a Triton version
        urls[TRITON_URL_KEY] = triton_model_url(settings, model_name, version)
    return {k: v for k, v in urls.items() if v}


def report(
    result,
    *,
    ti=None,
    settings: Settings | None = None,
    logger: logging.Logger | None = None,
    model_name: str | None = None,
) -> dict:
    """Log a step's outcome as a short story; return the small dict a task pushes to XCom.

    With the task instance ``ti`` and ``settings``, also push the URLs the plugin's extra links
    show (:func:`step_links`) for ``model_name``'s Triton models.
    """
    logger = logger or log
    logger.info("%s", result.line())
    figures = {k: v for k, v in result.summary.items() if _figure(v) is not None}
    if figures:
        logger.info("%s figures: %s", result.step, ", ".join(f"{k}={_figure(v)}" for k, v in figures.items()))
    root = Path(result.workspace)
    if result.outputs:
        sizes = []
        for rel in list(result.outputs)[:8]:
            p = root / rel
            size = p.stat().st_size if p.is_file() else 0
            sizes.append(f"{rel} ({size / 1e6:.2f} MB)" if size >= 10_000 else rel)
        more = f" and {len(result.outputs) - 8} more" if len(result.outputs) > 8 else ""
        logger.info("%s artifacts in %s: %s%s", result.step, root, ", ".join(sizes), more)
    else:
        logger.info("%s workspace: %s", result.step, root)
    if ti is not None and settings is not None:
        for key, url in step_links(result, settings, model_name).items():
            ti.xcom_push(key=key, value=url)
            logger.info("%s link: %s", result.step, url)
    return {
        "step": result.step,
        "status": result.status,
        "seconds": round(float(result.seconds), 3),
        "message": result.message,
        "workspace": str(root),
        **{k: v for k, v in figures.items() if not isinstance(v, str) or len(v) <= 200},
    }


def champion_skip_reason(release, *, model_name: str) -> str | None:
    """Why a run need not release: this checkpoint, with this serving configuration, already is the
    MLflow champion (else None). Same checkpoint with other thresholds is a new release."""
    from seqcls.registry.ledger import champion_fingerprint, champion_release_key, release_key

    champion = champion_fingerprint(release.settings, model_name)
    if champion_release_key(release.settings, model_name) == release_key(release):
        return (
            f"checkpoint {release.checkpoint.path} (fingerprint {release.checkpoint.short_fingerprint}) is "
            f"already the MLflow champion of {model_name!r}: nothing to release"
        )
    log.info(
        "MLflow champion of %r: %s; this checkpoint: %s",
        model_name,
        champion[:16] if champion else "none yet",
        release.checkpoint.short_fingerprint,
    )
    return None


def triton_model_url(settings: Settings, model_name: str, version: int | None) -> str | None:
    """Triton's HTTP metadata URL for ``model_name``'s ensemble at ``version`` (first endpoint), if known."""
    if not version or not settings.triton_http:
        return None
    from seqcls.serving.names import names_for

    model = names_for(model_name).ensemble
    host = settings.triton_http[0]
    base = host if host.startswith(("http://", "https://")) else f"http://{host}"
    return f"{base.rstrip('/')}/v2/models/{model}/versions/{version}"


def mlflow_version_url(settings: Settings, model_name: str, version: int | None) -> str | None:
    if not version:
        return None
    from seqcls.registry.ledger import model_version_url

    return model_version_url(settings, model_name, version)


def configure_logging() -> None:
    """In an external interpreter nothing configures logging: send INFO to stdout (the task log)."""
    root = logging.getLogger()
    if not root.handlers:
        import sys

        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")


__all__ = [
    "LATEST",
    "MLFLOW_URL_KEY",
    "RESOLVE_TASK",
    "ROLLBACK_ON",
    "ROLLBACK_TASK",
    "TASK_ORDER",
    "TASK_STEPS",
    "TRITON_URL_KEY",
    "as_params",
    "champion_skip_reason",
    "config_from_params",
    "configure_logging",
    "connected",
    "locate_checkpoint",
    "mlflow_version_url",
    "open_for_task",
    "report",
    "run_task_step",
    "settings_from_params",
    "step_links",
    "sync_task",
    "task_settings",
    "triton_model_url",
]
