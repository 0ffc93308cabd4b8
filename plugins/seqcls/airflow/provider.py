"""seqcls as an Airflow provider: what ``airflow providers list`` shows and the Connection forms.

Airflow finds this through the ``apache_airflow_provider`` entry point of the installed ``seqcls``
distribution (``pyproject.toml``) and validates it against ``airflow/provider_info.schema.json``.
Since Airflow 3.2 the UI builds a connection type's form from this metadata — ``conn-fields`` (stored
in the Connection's extra under the field's name) and ``ui-field-behaviour`` (hide / relabel the
standard fields) — without importing the hook; a hook's ``get_connection_form_widgets`` is deprecated.

The extra keys are the ones the hooks always read (``grpc_endpoints``, ``http_endpoints``,
``repository``, ``store_conn_id``, ``tracking_uri``, ``token``), so Connections defined before these types existed —
``conn_type`` ``generic`` included — keep working. The task extra links are a plugin registered
through the ``airflow.plugins`` entry point (:mod:`seqcls.airflow.plugin`); they are listed here under
``extra-links`` (``airflow providers links``) but not as a provider ``plugins`` entry, which Airflow
would load a second time beside the entry point's (``Plugin 'seqcls' already registered``).

Pure data and the standard library only: providers are discovered in every Airflow process.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

PACKAGE = "seqcls"
TRITON_CONN_TYPE = "triton"
MLFLOW_CONN_TYPE = "mlflow"
HOOKS = "seqcls.airflow.hooks"
LINKS = ("seqcls.airflow.plugin.MlflowModelVersionLink", "seqcls.airflow.plugin.TritonModelLink")
TRITON_NAME = "Triton Inference Server (seqcls)"
MLFLOW_NAME = "MLflow (seqcls)"
INTEGRATIONS = (
    (TRITON_NAME, "https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/"),
    (MLFLOW_NAME, "https://mlflow.org/docs/latest/"),
)


def _text(label: str, description: str, *, secret: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": ["string", "null"]}
    if secret:
        schema["format"] = "password"  # rendered as a password input; Airflow treats it as sensitive
    return {"label": label, "description": description, "schema": schema}


TRITON_FIELDS = {
    "grpc_endpoints": _text(
        "gRPC endpoints",
        "host:port of every Triton replica, comma-separated (e.g. triton-a:8001,triton-b:8001), or "
        "dns:///name:8001 for every address a name resolves to. Empty: the host and port above.",
    ),
    "http_endpoints": _text(
        "HTTP endpoints",
        "host:port of the same replicas' HTTP ports, same order (optional; the task links use the first).",
    ),
    "repository": _text(
        "Model repository",
        "The live model repository: a path as the Airflow workers see it (Triton's --model-repository, "
        "shared), or s3://bucket/prefix on an S3-API object store.",
    ),
    "store_conn_id": _text(
        "Object store connection",
        "For an s3:// repository: the Connection of its endpoint, region and credentials (Amazon's aws "
        "type: login = access key id, password = secret access key, extras endpoint_url, region_name, "
        "aws_session_token). Empty: aws_default, else the workers' AWS_* variables.",
    ),
}

MLFLOW_FIELDS = {
    "tracking_uri": _text(
        "Tracking URI",
        "http(s)://host:port of the MLflow server (or sqlite:///path/mlflow.db), without credentials. "
        "Empty: scheme://host:port from the fields above.",
    ),
    "token": _text("Token", "A bearer token for MLflow (instead of login and password).", secret=True),
}


def _connection_type(conn_type: str, hook: str, name: str, fields: dict, behaviour: dict) -> dict[str, Any]:
    return {
        "connection-type": conn_type,
        "hook-class-name": f"{HOOKS}.{hook}",
        "hook-name": name,
        "conn-fields": fields,
        "ui-field-behaviour": behaviour,
    }


CONNECTION_TYPES = [
    _connection_type(
        TRITON_CONN_TYPE,
        "TritonHook",
        TRITON_NAME,
        TRITON_FIELDS,
        {
            "hidden-fields": ["schema", "login"],
            "relabeling": {"host": "gRPC host (one replica)", "port": "gRPC port", "password": "Model-control key"},
            "placeholders": {"host": "triton", "port": "8001", "password": "SEQCLS_TRITON_CONTROL_KEY of the servers"},
        },
    ),
    _connection_type(
        MLFLOW_CONN_TYPE,
        "MlflowHook",
        MLFLOW_NAME,
        MLFLOW_FIELDS,
        {
            "hidden-fields": [],
            "relabeling": {"schema": "Scheme", "login": "Username", "password": "Password (or token without username)"},
            "placeholders": {"schema": "http", "host": "mlflow", "port": "5000"},
        },
    ),
]


def version() -> str:
    """The installed distribution's version (the provider's)."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:  # imported from a source tree that is not installed
        return "0+unknown"


def get_provider_info() -> dict[str, Any]:
    """The ``apache_airflow_provider`` entry point: Airflow's provider-info dict for ``seqcls``."""
    return {
        "package-name": PACKAGE,
        "name": "seqcls",
        # plain text: `airflow providers list` strips RST markup (underscores, backticks) from it
        "description": "Release PaddleNLP ERNIE text classifiers to NVIDIA Triton, registered in MLflow: "
        "the connection types triton and mlflow (form fields, Test) and the release tasks' extra links.",
        "versions": [version()],
        "integrations": [
            {"integration-name": name, "tags": ["software"], "external-doc-url": url} for name, url in INTEGRATIONS
        ],
        "hooks": [{"integration-name": name, "python-modules": [HOOKS]} for name, _ in INTEGRATIONS],
        "connection-types": CONNECTION_TYPES,
        "extra-links": list(LINKS),
    }


__all__ = ["CONNECTION_TYPES", "MLFLOW_CONN_TYPE", "TRITON_CONN_TYPE", "get_provider_info", "version"]
