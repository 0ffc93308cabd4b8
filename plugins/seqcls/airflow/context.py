"""What a release task starts from: its place in the task table, its params as library objects, its release.

Every task of ``dags/seqcls_release.py`` turns its params into :class:`~seqcls.settings.Settings` +
:class:`~seqcls.config.ReleaseConfig` and re-opens the release workspace (deterministic, so no XCom
is needed to find it) before it calls one library step. The mapping lives here and nothing else:
release logic stays in the step modules, task policy in :mod:`seqcls.airflow.tasks`.

Imports nothing from Airflow, so the heavy Paddle tasks run it in another interpreter
(``@task.external_python``, :func:`run_heavy_step`) where Airflow may not be installed, and the DAG
file imports the task table at parse time cheaply. Connections are read by the tasks
(:func:`seqcls.airflow.tasks.connected`), not here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from seqcls.airflow.report import configure_logging, report
from seqcls.airflow.roots import locate_checkpoint, model_root, refuse_root_param
from seqcls.config import ReleaseConfig
from seqcls.errors import InputError
from seqcls.release.intake import open_release, reopen_release
from seqcls.release.workspace import Release
from seqcls.settings import Settings
from seqcls.steps import BY_NAME, STEPS, step

#: DAG task id → the manifest step it runs (in order), derived from the step table.
#: ``resolve_checkpoint`` opens the workspace; ``rollback`` runs only after a failure.
TASK_STEPS: dict[str, str] = {s.task_id: s.name for s in STEPS}
RESOLVE_TASK = "resolve_checkpoint"
ROLLBACK_TASK = BY_NAME["rollback"].task_id
TASK_ORDER: tuple[str, ...] = (RESOLVE_TASK, *TASK_STEPS, ROLLBACK_TASK)
#: Tasks whose failure leaves something to undo on the servers or in the registry.
ROLLBACK_ON: tuple[str, ...] = tuple(s.task_id for s in STEPS if s.undo_on_failure)

#: DAG params that are not release parameters (they pick a checkpoint, connections...).
#: Not among them: the checkpoints root, which the deployment sets (``seqcls.airflow.roots``).
NON_RELEASE_PARAMS = frozenset(
    {"checkpoint", "triton_conn_id", "mlflow_conn_id", "skip_if_champion", "keep_refused", "mlflow_versions"}
    | {"evidence_keep", "statelog_rotate_bytes"}
)
RELEASE_PARAMS = frozenset(f.name for f in fields(ReleaseConfig))


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
    """The validated release config; a bad value raises InputError naming the param.

    The trigger form sends what was typed: an emptied optional field as ``""`` (None here), ``thresholds``
    as JSON text, a number as text (``"1e-8"``: the form has no number widget for them, it rounded),
    which :meth:`ReleaseConfig.from_dict` reads exactly with ``float()``.
    """
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


def confined_eval_set(config: ReleaseConfig, settings: Settings) -> ReleaseConfig:
    """The ``eval_set`` param as a file under the model's checkpoints root (absolute, or relative to it):
    whoever triggers a run may make the workers read only what the deployment put there."""
    if not config.eval_set:
        return config
    root = Path(settings.checkpoints_root or ".").expanduser().resolve()
    given = Path(config.eval_set).expanduser()
    real = (given if given.is_absolute() else root / given).resolve()
    if not real.is_relative_to(root):
        raise InputError(
            f"eval_set {config.eval_set!r} resolves to {real}, outside this model's checkpoints root {root}: a DAG "
            "run reads eval sets only from under that root. Copy the file there (symlinks leaving it do not count) "
            "and give its path relative to the root."
        )
    return replace(config, eval_set=str(real))


def settings_from_params(
    params: Mapping[str, Any] | str | None, *, checkpoints_root: str | Path | None = None, **overrides: Any
) -> Settings:
    """Settings from the environment (no Airflow Connections; how the model is served is the release's
    serving spec, from its params — the environment only supplies its defaults, at resolve).

    ``checkpoints_root``: the model's root as the DAG file got it from the models file (absolute, or
    relative to ``SEQCLS_CHECKPOINTS_ROOT``; empty = that root itself) — never from a param.
    """
    values = as_params(params)
    refuse_root_param(values)
    settings = Settings.from_env(**overrides)
    if checkpoints_root is None:
        return settings
    return replace(settings, checkpoints_root=model_root(checkpoints_root, Path(str(settings.checkpoints_root))))


def open_for_task(
    checkpoint: str | None,
    params: Mapping[str, Any] | str | None,
    settings: Settings | None = None,
    *,
    fingerprint: str | None = None,
    checkpoints_root: str | None = None,
) -> Release:
    """Re-open the release a run works on: the snapshot of the fingerprint resolve_checkpoint resolved.

    ``checkpoint``/``fingerprint`` are what ``resolve_checkpoint`` pushed. With a fingerprint the
    release is its workspace's snapshot, verified (:func:`~seqcls.release.intake.reopen_release`): a
    checkpoint changed in place since resolve has no effect on the run, on this worker or another.
    The directory (under the model's checkpoints root: ``settings``', else ``checkpoints_root``) is
    read only to re-make a lost snapshot, and only while it still hashes to the fingerprint. Without
    one (``airflow tasks test``) the ``checkpoint`` param is resolved as it is now.
    """
    values = as_params(params)
    settings = settings or settings_from_params(values, checkpoints_root=checkpoints_root)
    config = confined_eval_set(config_from_params(values), settings)

    def located() -> Path:
        return locate_checkpoint(checkpoint or values.get("checkpoint"), settings)

    if fingerprint:
        return reopen_release(settings, config, fingerprint, source=located)
    return open_release(located(), config, settings)


def run_heavy_step(name: str, checkpoint: str, fingerprint: str, params_json: str, checkpoints_root: str) -> dict:
    """A heavy (Paddle) task's whole body — the run's release, the step, its story — runnable where Airflow
    is not: params arrive rendered as JSON, settings come from the environment (no Connections)."""
    configure_logging()
    release = open_for_task(checkpoint, params_json, fingerprint=fingerprint, checkpoints_root=checkpoints_root)
    return report(step(name)(release))


__all__ = [
    "NON_RELEASE_PARAMS",
    "RELEASE_PARAMS",
    "RESOLVE_TASK",
    "ROLLBACK_ON",
    "ROLLBACK_TASK",
    "TASK_ORDER",
    "TASK_STEPS",
    "as_params",
    "config_from_params",
    "confined_eval_set",
    "open_for_task",
    "run_heavy_step",
    "settings_from_params",
]
