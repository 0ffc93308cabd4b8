"""What a Connection's *Test* button runs: one quick, read-only round trip to each system.

Airflow calls ``hook.test_connection()`` in the API server (``POST /api/v2/connections/test``, enabled
by ``[core] test_connection = Enabled``) and shows the ``(ok, message)`` it returns; the hooks
(:mod:`seqcls.airflow.hooks`) resolve the Connection and call these. Nothing here imports Airflow.

- Triton, per replica: gRPC liveness, then the repository index *with the control key* — the
  restricted call every release starts with, so a wrong key fails here as it would fail a release —
  and the HTTP endpoint's ``/v2/health/live`` when one is configured. No retries: an answer in seconds.
- MLflow: one registry call (``search_registered_models(max_results=1)``) with the Connection's
  credentials in MLflow's variables, MLflow's HTTP retries off for the call.

Messages name the address and what to fix; they never carry a key, password or token.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from seqcls.registry.ledger import client, tracking_uri
from seqcls.serving.client import ControlRefused, Endpoint, TritonOps
from seqcls.settings import Settings, scoped_environ

TIMEOUT_S = 5.0
#: MLflow's own HTTP settings for the test call: one attempt (its default retries take minutes).
MLFLOW_FAIL_FAST = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
MAX_DETAIL = 300
#: MLflow's error codes for a refused login/token (HTTP 401 / 403).
REFUSED = frozenset({"UNAUTHENTICATED", "PERMISSION_DENIED"})


def _detail(exc: BaseException) -> str:
    """The error's own text (tritonclient's ``message()``), on one line, cut to :data:`MAX_DETAIL`."""
    message = getattr(exc, "message", None)
    text = " ".join(str(message() if callable(message) else exc).split())
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"


def _http_live(address: str, timeout: float) -> str | None:
    """None when ``address`` answers ``/v2/health/live`` with 200, else why not."""
    base = address if address.startswith(("http://", "https://")) else f"http://{address}"
    try:
        with urllib.request.urlopen(f"{base.rstrip('/')}/v2/health/live", timeout=timeout) as r:
            return None if r.status == 200 else f"HTTP {address} answered {r.status} to /v2/health/live"
    except (urllib.error.URLError, OSError) as exc:
        return f"HTTP {address} is not answering ({_detail(exc)})"


def triton_replica(endpoint: Endpoint, timeout: float = TIMEOUT_S) -> tuple[bool, str]:
    """One replica: live over gRPC, the repository index with the key, HTTP live (if configured)."""
    from tritonclient.utils import InferenceServerException

    ops = TritonOps(endpoint, request_timeout=timeout)
    try:
        if not ops.client.is_server_live(client_timeout=timeout):
            return False, f"Triton at {endpoint.grpc} is not live"
    except InferenceServerException as exc:
        return False, f"Triton is not answering at {endpoint.grpc} (gRPC): {_detail(exc)}"
    try:
        index = ops.client.get_model_repository_index(as_json=True, client_timeout=timeout).get("models", [])
    except ControlRefused as exc:
        return False, str(exc)
    except InferenceServerException as exc:
        return False, f"Triton at {endpoint.grpc}: the repository index failed: {_detail(exc)}"
    line = f"{endpoint.grpc} live, model control accepted the key ({len(index)} model version(s) indexed)"
    if endpoint.http:
        problem = _http_live(endpoint.http, timeout)
        if problem:
            return False, f"Triton at {endpoint.grpc}: {problem}"
        line += f", HTTP {endpoint.http} live"
    return True, line


def check_triton(
    endpoints: Sequence[Endpoint], repository: Path | None, key_source: str, timeout: float = TIMEOUT_S
) -> tuple[bool, str]:
    """Every replica (the first failure is the message); the repository is only reported: the API
    server that runs the test need not mount it, the workers must."""
    lines = []
    for endpoint in endpoints:
        ok, line = triton_replica(endpoint, timeout)
        if not ok:
            return False, line
        lines.append(line)
    where = ""
    if repository is not None:
        seen = "exists here" if Path(repository).is_dir() else "not visible here (the workers must mount it)"
        where = f"; repository {repository}: {seen}"
    return True, f"Triton OK — {len(lines)} replica(s): {'; '.join(lines)}; control key from {key_source}{where}"


def check_mlflow(settings: Settings, credentials: Mapping[str, str | None]) -> tuple[bool, str]:
    """One registry call against the settings' tracking URI with ``credentials`` (MLflow's variables)."""
    uri = tracking_uri(settings)
    with scoped_environ({**MLFLOW_FAIL_FAST, **credentials}):
        try:
            found = client(settings).search_registered_models(max_results=1)
        except Exception as exc:
            detail = _detail(exc)
            code = str(getattr(exc, "error_code", ""))  # an MlflowException from MLflow's JSON error body
            if code in REFUSED or any(f"error code {status}" in detail for status in ("401", "403")):
                return False, (
                    f"MLflow at {uri} refused the credentials ({detail[:120]}): set the Connection's login and "
                    "password, or a token"
                )
            return False, f"MLflow at {uri} did not answer the registry call: {detail}"
    what = "registered models found" if found else "no registered model yet"
    auth = "with the Connection's credentials" if credentials else "without credentials"
    return True, f"MLflow OK — the model registry at {uri} answered {auth} ({what})"


__all__ = ["check_mlflow", "check_triton", "triton_replica"]
