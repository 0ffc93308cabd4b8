"""Every environment variable seqcls reads, with its default and meaning: the configuration reference.

Why a module of its own: ``docs/configuration.md`` is generated from :data:`ENVIRONMENT` and a test
checks that no variable is read without a row here; the names and defaults stay in
:mod:`seqcls.settings`, the one place that reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass

from seqcls.settings import (
    CONTROL_KEY_FILE,
    DEFAULT_EVAL_SET_MAX_MB,
    DEFAULT_EVAL_SET_MAX_TEXTS,
    DEFAULT_GC_EVIDENCE_KEEP,
    DEFAULT_GC_KEEP_REFUSED,
    DEFAULT_GC_MIN_AGE,
    DEFAULT_GC_MLFLOW_VERSIONS,
    DEFAULT_GRPC,
    DEFAULT_HTTP,
    DEFAULT_METRICS,
    DEFAULT_MODEL_NAME,
    DEFAULT_STATELOG_ROTATE_BYTES,
    DEVICES,
    ENV_AIRFLOW_RUN_URL,
    ENV_ALLOW_UNSAFE_PICKLE,
    ENV_CHECKPOINTS_ROOT,
    ENV_DEVICE,
    ENV_EVAL_SET_MAX_MB,
    ENV_EVAL_SET_MAX_TEXTS,
    ENV_FAULT_PLAN,
    ENV_GC_EVIDENCE_KEEP,
    ENV_GC_KEEP_REFUSED,
    ENV_GC_MIN_AGE,
    ENV_GC_MLFLOW_VERSIONS,
    ENV_HOME,
    ENV_MLFLOW_URI,
    ENV_MODEL_NAME,
    ENV_MODEL_REPOSITORY_SOURCE,
    ENV_MODELS_FILE,
    ENV_NOTIFY_URLS,
    ENV_PADDLE_PYTHON,
    ENV_PROMETHEUS_URL,
    ENV_RUNTIME,
    ENV_SCHEDULE,
    ENV_SERVING_LAYOUT,
    ENV_SERVING_METRICS,
    ENV_SERVING_PIPELINE,
    ENV_STATELOG_ROTATE_BYTES,
    ENV_TRITON_CONTROL_KEY,
    ENV_TRITON_GRPC,
    ENV_TRITON_HTTP,
    ENV_TRITON_METRICS,
    ENV_TRITON_REPOSITORY,
    ENV_TRITON_RESOLVE,
    PIPELINES,
    RUNTIMES,
)


@dataclass(frozen=True)
class EnvVar:
    """One environment variable seqcls reads: the generated configuration reference lists these."""

    name: str
    default: str
    description: str
    #: What it is the default of, when a flag/param/models-file key can say it per release (else "").
    overridden_by: str = ""


#: Every ``SEQCLS_*`` variable read anywhere, with its default and meaning (docs/configuration.md is
#: generated from this table; a test checks no variable is read without a row here).
ENVIRONMENT: tuple[EnvVar, ...] = (
    EnvVar(
        ENV_HOME, "~/.seqcls", "Release home: workspaces, the MLflow sqlite store and artifacts, local Triton state."
    ),
    EnvVar(
        ENV_TRITON_REPOSITORY,
        "$SEQCLS_HOME/triton/model_repository",
        "The live Triton model repository (what Triton reads; never the git tree).",
        "the Triton Connection's `repository` extra",
    ),
    EnvVar(
        ENV_TRITON_GRPC,
        DEFAULT_GRPC,
        "Triton gRPC endpoints, comma-separated, one per replica, or `dns:///name:port` (every address of name).",
        "the Triton Connection's `grpc_endpoints` extra",
    ),
    EnvVar(
        ENV_TRITON_HTTP,
        DEFAULT_HTTP,
        "Triton HTTP endpoints, in the same order as the gRPC ones.",
        "the Triton Connection's `http_endpoints` extra",
    ),
    EnvVar(
        ENV_TRITON_METRICS,
        f"{DEFAULT_METRICS} with the default endpoints, else unset",
        "One metrics host:port per endpoint: the smoke report quotes Triton's request counters.",
    ),
    EnvVar(ENV_TRITON_RESOLVE, "unset", "Static answers for dns:/// endpoints: name=addr,addr;name2=addr."),
    EnvVar(
        ENV_TRITON_CONTROL_KEY,
        f"the local Triton's key file <repository>/{CONTROL_KEY_FILE}",
        "The key Triton's model control requires (16-512 characters; `openssl rand -hex 32`).",
        "the Triton Connection's password",
    ),
    EnvVar(
        ENV_MLFLOW_URI,
        "MLFLOW_TRACKING_URI, else sqlite:///$SEQCLS_HOME/mlflow/mlflow.db",
        "MLflow tracking server and model registry (credentials never in the URI).",
        "the MLflow Connection",
    ),
    EnvVar(
        ENV_RUNTIME,
        RUNTIMES[0],
        "Serving spec default: Triton's backend for <m>_model (onnxruntime = the native backend, NGC image).",
        "--runtime / param runtime / models file serving.runtime",
    ),
    EnvVar(
        ENV_DEVICE,
        DEVICES[0],
        "Serving spec default: the device serving configs are rendered for (gpu: GPU instance group, buckets).",
        "--device / param device / models file serving.device",
    ),
    EnvVar(
        ENV_SERVING_PIPELINE,
        PIPELINES[0],
        "Serving spec default: ensemble (Triton's ensemble of three python models) or direct (one python model).",
        "--pipeline / param pipeline / models file serving.pipeline",
    ),
    EnvVar(
        ENV_SERVING_LAYOUT,
        "1x2",
        "Serving spec default: the ONNX model's INSTANCESxTHREADS on CPU (`seqcls calibrate-layout` measures it).",
        "--layout / param layout / models file serving.layout",
    ),
    EnvVar(
        ENV_SERVING_METRICS,
        "on",
        "Serving spec default: off publishes python models without seqcls_* metrics (to measure their cost).",
        "--serving-metrics / param serving_metrics / models file serving.metrics",
    ),
    EnvVar(
        ENV_EVAL_SET_MAX_MB,
        str(DEFAULT_EVAL_SET_MAX_MB),
        "The largest eval set a release reads, in MB: a larger one is refused in seconds, before it is parsed.",
    ),
    EnvVar(
        ENV_EVAL_SET_MAX_TEXTS,
        str(DEFAULT_EVAL_SET_MAX_TEXTS),
        "The most labeled texts a release scores (each is run through the candidate and the champion).",
    ),
    EnvVar(
        ENV_GC_KEEP_REFUSED,
        str(DEFAULT_GC_KEEP_REFUSED),
        "`seqcls gc`: per model, the newest refused attempts whose evidence (`failed/`) is kept.",
        "`seqcls gc --keep-refused` / models file keep_refused",
    ),
    EnvVar(
        ENV_GC_EVIDENCE_KEEP,
        str(DEFAULT_GC_EVIDENCE_KEEP),
        "`seqcls gc`: per model, the newest releases whose evidence stays as it is; older ones nothing else keeps "
        "are compacted into one audit record each (manifest, hashes, verdicts, reports).",
        "`seqcls gc --evidence-keep` / DAG param evidence_keep",
    ),
    EnvVar(
        ENV_STATELOG_ROTATE_BYTES,
        str(DEFAULT_STATELOG_ROTATE_BYTES),
        "`seqcls gc`: a model's state log larger than this (bytes) is rotated into a compressed segment and a "
        "snapshot; the common readers (state recovery, `history --limit`) read the snapshot and what follows it.",
        "`seqcls gc --statelog-rotate-bytes` / DAG param statelog_rotate_bytes",
    ),
    EnvVar(
        ENV_GC_MIN_AGE,
        f"{DEFAULT_GC_MIN_AGE:.0f}",
        "`seqcls gc`: seconds a release workspace is left alone after its last write (a release may be between steps).",
    ),
    EnvVar(
        ENV_GC_MLFLOW_VERSIONS,
        DEFAULT_GC_MLFLOW_VERSIONS,
        "`seqcls gc`: an MLflow version whose release workspace gc collects is `archive`d (its graphs deleted, "
        "the version kept with its tags, metrics and evidence), `delete`d, or left alone (`keep`).",
        "`seqcls gc --mlflow-versions` / DAG param mlflow_versions",
    ),
    EnvVar(
        ENV_PADDLE_PYTHON, "the same interpreter", "Interpreter for the heavy Paddle tasks (@task.external_python)."
    ),
    EnvVar(
        ENV_MODEL_REPOSITORY_SOURCE,
        "model_repository/ of this project",
        "Templates and python models rendered into each published version.",
    ),
    EnvVar(
        ENV_CHECKPOINTS_ROOT,
        "$SEQCLS_HOME/checkpoints",
        "Where DAG runs may take checkpoints and eval sets from; checkpoint=latest looks here.",
        "models file checkpoints_root (per model, under it)",
    ),
    EnvVar(ENV_MODEL_NAME, DEFAULT_MODEL_NAME, "The single release DAG's model, when there is no models file."),
    EnvVar(ENV_SCHEDULE, "manual", "The single release DAG's schedule: manual, a cron preset/expression, or asset."),
    EnvVar(
        ENV_MODELS_FILE,
        "dags/seqcls-models.yaml if present",
        "The models file: one release DAG per model; none = the single seqcls_release DAG.",
    ),
    EnvVar(ENV_NOTIFY_URLS, "unset: nothing sent", "Apprise URLs (space-separated) told how CLI releases ended."),
    EnvVar(
        ENV_PROMETHEUS_URL,
        "unset: $SEQCLS_HOME/monitor/<model>.jsonl readings",
        "The Prometheus scraping every replica, for `seqcls monitor --since`.",
    ),
    EnvVar(
        ENV_ALLOW_UNSAFE_PICKLE,
        "off",
        "1 lets a release with allow_unsafe_pickle load a .pdparams unscanned (trusted legacy files only).",
    ),
    EnvVar(ENV_AIRFLOW_RUN_URL, "set by the DAG's tasks", "The Airflow run page a release links to (MLflow tag)."),
    EnvVar(
        ENV_FAULT_PLAN,
        "unset",
        "Test-only: make a release fail, die, stall or pause at a named point; `@path` reads the plan from a file "
        "(seqcls.faults).",
    ),
    EnvVar(
        "SEQCLS_PORT_RANGE",
        "below the kernel's ephemeral range",
        "low-high: where tests and the demo stack pick free ports (the test suite gives each xdist worker a slice).",
    ),
    EnvVar(
        "AWS_ENDPOINT_URL_S3",
        "unset (AWS_ENDPOINT_URL, then AWS S3)",
        "The S3 API endpoint of an object-store repository (MinIO, SeaweedFS...), when no Connection gives one.",
    ),
    EnvVar("AWS_REGION", "unset (AWS_DEFAULT_REGION)", "The object store's region, when no Connection gives one."),
    EnvVar(
        "AWS_ACCESS_KEY_ID",
        "unset (botocore's own chain)",
        "With AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN): the object store's credentials when no Connection "
        "gives them; never logged.",
    ),
)


__all__ = ["ENVIRONMENT", "EnvVar"]
