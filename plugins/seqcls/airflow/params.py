"""The DAG's Params form, generated from :data:`seqcls.config.FIELDS` plus the run-level params.

Release parameters get their type, range, enum, title, description and form section from the config
table, so the trigger form validates exactly what :class:`~seqcls.config.ReleaseConfig` accepts; the
run-level params (which checkpoint, Connections) are defined here, once. Where checkpoints
come from is not among them: the model's checkpoints root is the deployment's (``seqcls.airflow.roots``),
named in the ``checkpoint`` param's description only.

The form shows four sections (Airflow 3's Params ``section``; :data:`seqcls.config.SECTIONS`): the
everyday params first, in Airflow's open *Run Parameters* section (:data:`LEAD` at its top), then the
serving spec (profile aside: runtime, pipeline, device, layout, metrics), then the
gates' tolerances, then the expert knobs, all folded. Numbers are text fields there, read exactly
(:meth:`seqcls.fields.Field.parse`): what is typed is what the release gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import Param

from seqcls.config import EXPERT_SECTION, FIELDS, SECTIONS, param_schema
from seqcls.settings import ENV_CHECKPOINTS_ROOT, GC_MLFLOW_POLICIES

#: The params a person sets most, at the top of the form's first section (in this order).
LEAD = ("checkpoint", "model_name", "profile", "skip_if_champion")


def root_label(root: str = "") -> str:
    """How the form names a model's checkpoints root (as configured: resolved on the worker)."""
    text = root.strip()
    if not text:
        return ENV_CHECKPOINTS_ROOT
    return text if text.startswith(("/", "~")) else f"{ENV_CHECKPOINTS_ROOT}/{text}"


def _retention_count(title: str, minimum: int, description: str) -> dict[str, Any]:
    """A whole-number retention param of the run's gc after promote (empty: its setting)."""
    return {"default": None, "type": ["integer", "null"], "minimum": minimum, "title": title,
            "description": f"Retention after this run's promote (`seqcls gc`): {description}",
            "section": EXPERT_SECTION}  # fmt: skip


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
        "skip_if_champion": {
            "default": True,
            "type": "boolean",
            "title": "Skip if already champion",
            "description": "End as skipped when the checkpoint already is the MLflow champion (always on for "
            "scheduled and asset-triggered runs). Turn off to release it again, e.g. after a Triton restart.",
        },
        "keep_refused": _retention_count(
            "Refused attempts kept",
            0,
            "the newest N refused attempts of the model keep their evidence (failed/); "
            "older ones are collected. Empty: SEQCLS_GC_KEEP_REFUSED (5).",
        ),
        "evidence_keep": _retention_count(
            "Releases whose evidence stays",
            0,
            "the newest N releases of the model keep their evidence as it is; "
            "older ones nothing else keeps are compacted into one audit record each. "
            "Empty: SEQCLS_GC_EVIDENCE_KEEP (30).",
        ),
        "statelog_rotate_bytes": _retention_count(
            "State log rotation (bytes)",
            1,
            "the model's state log larger than this is rotated into a compressed "
            "segment and a snapshot. Empty: SEQCLS_STATELOG_ROTATE_BYTES (256000).",
        ),
        "mlflow_versions": {
            "default": None,
            "type": ["string", "null"],
            "enum": [None, *GC_MLFLOW_POLICIES],
            "title": "Old MLflow versions",
            "description": "Retention after this run's promote (`seqcls gc`): an MLflow version whose release "
            "workspace is collected is archived (its graphs deleted; the version, tags and evidence kept), deleted, "
            "or kept. Empty: SEQCLS_GC_MLFLOW_VERSIONS (archive).",
            "section": EXPERT_SECTION,
        },
        "triton_conn_id": {
            "default": "triton_default",
            "type": "string",
            "minLength": 1,
            "title": "Triton connection",
            "description": "Airflow Connection (type triton) of the Triton replicas this run releases to, with the "
            "live model repository and the model-control key.",
            "section": EXPERT_SECTION,
        },
        "mlflow_conn_id": {
            "default": "mlflow_default",
            "type": "string",
            "minLength": 1,
            "title": "MLflow connection",
            "description": "Airflow Connection (type mlflow) of the tracking server and model registry this run "
            "records to; the evidence pages link to its UI.",
            "section": EXPERT_SECTION,
        },
    }


def schemas(model_name: str, defaults: Mapping[str, Any] | None = None, *, root: str = "") -> dict[str, dict[str, Any]]:
    """Every DAG param's schema (with default), in the form's order: section by section
    (:data:`seqcls.config.SECTIONS`), :data:`LEAD` first, then the release parameters in table order,
    then the run-level params.

    ``defaults`` (a model's entry of the models file, validated there) replaces defaults by name;
    ``root`` is the model's checkpoints root (:func:`run_params`).
    """
    release = {f.name: param_schema(f.name) for f in FIELDS}
    release["model_name"]["default"] = str(model_name)  # a plain string: Airflow serializes the DAG strictly
    every = {**release, **run_params(model_name, root)}

    def place(name: str) -> tuple[int, int]:
        return SECTIONS.index(every[name].get("section")), LEAD.index(name) if name in LEAD else len(LEAD)

    out = {name: every[name] for name in sorted(every, key=place)}
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
