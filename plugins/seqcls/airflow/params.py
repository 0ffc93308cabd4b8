"""The DAG's Params form, generated from :data:`seqcls.config.FIELDS` plus the run-level params.

Release parameters get their type, range, enum, title and description from the config table, so
the trigger form validates exactly what :class:`~seqcls.config.ReleaseConfig` accepts; the
run-level params (which checkpoint, runtime, Connections) are defined here, once. Where checkpoints
come from is not among them: the model's checkpoints root is the deployment's (``seqcls.airflow.roots``),
named in the ``checkpoint`` param's description only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import Param

from seqcls.config import FIELDS, param_schema
from seqcls.settings import ENV_CHECKPOINTS_ROOT, RUNTIMES, default_runtime


def root_label(root: str = "") -> str:
    """How the form names a model's checkpoints root (as configured: resolved on the worker)."""
    text = root.strip()
    if not text:
        return ENV_CHECKPOINTS_ROOT
    return text if text.startswith(("/", "~")) else f"{ENV_CHECKPOINTS_ROOT}/{text}"


def run_params(model_name: str, root: str = "") -> dict[str, dict[str, Any]]:
    """Schemas of the params that pick what to release (not release parameters); ``root`` = the model's
    configured checkpoints root (models file), shown in the ``checkpoint`` description."""
    return {
        "checkpoint": {
            "default": "latest",
            "type": "string",
            "minLength": 1,
            "title": "Checkpoint",
            "description": "Checkpoint directory (save_pretrained output + label.txt) under this model's "
            f"checkpoints root {root_label(root)}, absolute or relative to it (a path resolving outside it, "
            "symlinks followed, is refused; the root is set by the deployment, not per run); 'latest' = the one "
            "there whose SEQCLS_DONE.json marker (written by the training job) records the newest completed_at. "
            "Scheduled runs use 'latest'.",
        },
        "runtime": {
            "default": default_runtime(),
            "type": "string",
            "enum": list(RUNTIMES),
            "title": "Triton runtime",
            "description": "python-onnxruntime (python backend, local Triton) or onnxruntime (native backend, "
            "NGC image).",
        },
        "skip_if_champion": {
            "default": True,
            "type": "boolean",
            "title": "Skip if already champion",
            "description": "End as skipped when the checkpoint already is the MLflow champion (always on for "
            "scheduled and asset-triggered runs). Turn off to release it again, e.g. after a Triton restart.",
        },
        "triton_conn_id": {"default": "triton_default", "type": "string", "minLength": 1, "title": "Triton connection"},
        "mlflow_conn_id": {"default": "mlflow_default", "type": "string", "minLength": 1, "title": "MLflow connection"},
    }


def schemas(model_name: str, defaults: Mapping[str, Any] | None = None, *, root: str = "") -> dict[str, dict[str, Any]]:
    """Every DAG param's schema (with default): which checkpoint first, then the release parameters, then
    the other run-level params.

    ``defaults`` (a model's entry of the models file, validated there) replaces defaults by name;
    ``root`` is the model's checkpoints root (:func:`run_params`).
    """
    release = {f.name: param_schema(f.name) for f in FIELDS}
    release["model_name"]["default"] = model_name
    run = run_params(model_name, root)
    out = {"checkpoint": run.pop("checkpoint"), **release, **run}
    unknown = sorted(set(defaults or {}) - set(out))
    if unknown:
        raise KeyError(f"not DAG params: {', '.join(unknown)}")
    for name, value in (defaults or {}).items():
        out[name] = {**out[name], "default": value}
    return out


def dag_params(model_name: str, defaults: Mapping[str, Any] | None = None, *, root: str = "") -> dict[str, Param]:
    out = {}
    for name, schema in schemas(model_name, defaults, root=root).items():
        kwargs = dict(schema)
        out[name] = Param(kwargs.pop("default"), **kwargs)
    return out
