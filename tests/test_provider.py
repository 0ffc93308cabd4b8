"""seqcls as an Airflow provider (issue 14): provider info, connection types, ``test_connection``.

- the provider info validates against Airflow 3.3's runtime schema (``provider_info.schema.json``)
  and each connection type against the stricter ``provider.yaml`` schema (``conn-fields``,
  ``ui-field-behaviour``: what the UI builds the forms from);
- ``airflow providers list`` / ``providers hooks`` (a real CLI, the tests' private AIRFLOW_HOME) show
  ``seqcls`` with the ``triton`` and ``mlflow`` types, and the ProvidersManager turns the metadata into
  form widgets without importing the hooks;
- ``test_connection`` of both hooks against a real local Triton and a real MLflow (sqlite): True, and
  False with a message that names the address and the fix — wrong endpoint, wrong control key, wrong
  HTTP port, an MLflow that refuses the credentials (which did reach it).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jsonschema
import pytest

from seqcls.localtriton import free_ports
from tests.helpers.airflow import private_airflow_home

AIRFLOW_HOME = private_airflow_home()  # before anything imports airflow
AIRFLOW_PACKAGE = Path(importlib.util.find_spec("airflow").submodule_search_locations[0])  # not imported
HOOKS = {"triton": "seqcls.airflow.hooks.TritonHook", "mlflow": "seqcls.airflow.hooks.MlflowHook"}


def _airflow_json(*args: str) -> list[dict]:
    """``airflow <args> -o json`` in a subprocess (this process's AIRFLOW_HOME; cwd off sys.path)."""
    cmd = [str(Path(sys.executable).with_name("airflow")), *args, "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=os.environ.copy(), cwd=AIRFLOW_HOME)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout[out.stdout.index("[") :])


# ----------------------------------------------------------------------------- provider info


def test_provider_info_validates_against_the_airflow_schemas() -> None:
    from seqcls.airflow.provider import get_provider_info

    info = get_provider_info()
    runtime = json.loads((AIRFLOW_PACKAGE / "provider_info.schema.json").read_text(encoding="utf-8"))
    jsonschema.validate(info, runtime)  # what Airflow checks when it loads the entry point
    strict = json.loads((AIRFLOW_PACKAGE / "provider.yaml.schema.json").read_text(encoding="utf-8"))
    jsonschema.validate(info["connection-types"], strict["properties"]["connection-types"])
    assert info["package-name"] == "seqcls" and info["versions"] and info["versions"][0] != "0+unknown"
    types = {t["connection-type"]: t for t in info["connection-types"]}
    assert {k: t["hook-class-name"] for k, t in types.items()} == HOOKS
    # the extra keys the hooks have always read: old Connections keep working
    assert set(types["triton"]["conn-fields"]) == {"grpc_endpoints", "http_endpoints", "repository", "store_conn_id"}
    assert set(types["mlflow"]["conn-fields"]) == {"tracking_uri", "token"}
    assert types["triton"]["ui-field-behaviour"]["relabeling"]["password"] == "Model-control key"
    assert types["mlflow"]["conn-fields"]["token"]["schema"]["format"] == "password"
    assert set(info["extra-links"]) == {
        "seqcls.airflow.plugin.MlflowModelVersionLink",
        "seqcls.airflow.plugin.TritonModelLink",
    }
    assert "plugins" not in info, "the airflow.plugins entry point registers the plugin: here it would load twice"


def test_entry_points_are_declared_and_installed() -> None:
    """pyproject declares both; the installed distribution carries them (read outside the source tree)."""
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    declared = project["project"]["entry-points"]
    assert declared["apache_airflow_provider"] == {"provider_info": "seqcls.airflow.provider:get_provider_info"}
    assert declared["airflow.plugins"] == {"seqcls": "seqcls.airflow.plugin:SeqclsPlugin"}
    code = (
        "import json; from importlib.metadata import distribution as d;"
        "print(json.dumps(sorted([e.group, e.name, e.value] for e in d('seqcls').entry_points)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=AIRFLOW_HOME)
    assert out.returncode == 0, out.stderr[-2000:]
    installed = {(g, n): v for g, n, v in json.loads(out.stdout)}
    for group, points in declared.items():
        for name, value in points.items():
            assert installed.get((group, name)) == value, (
                f"the installed seqcls lacks {group}:{name}; refresh its metadata: "
                ".venv/bin/pip install --no-deps --no-build-isolation -e ."
            )


def test_airflow_lists_seqcls_with_both_connection_types() -> None:
    t0 = time.perf_counter()
    providers = {p["package_name"]: p for p in _airflow_json("providers", "list")}
    assert providers["seqcls"]["version"] and "Triton" in providers["seqcls"]["description"]
    hooks = {h["connection_type"]: h for h in _airflow_json("providers", "hooks") if h["package_name"] == "seqcls"}
    assert {k: h["class"] for k, h in hooks.items()} == HOOKS
    assert hooks["triton"]["conn_id_attribute_name"] == "triton_conn_id"
    assert hooks["mlflow"]["hook_name"] == "MLflow (seqcls)"
    # what the UI's connection form is built from, read from the metadata (no hook import, no wtforms)
    code = (
        "import json; from airflow.providers_manager import ProvidersManager as P; pm = P();"
        "w = pm._connection_form_widgets_from_metadata; b = pm._field_behaviours_from_metadata;"
        "print(json.dumps({'widgets': sorted(k for k in w if '__triton__' in k or '__mlflow__' in k),"
        "'sensitive': sorted(k for k in w if w[k].is_sensitive and '__mlflow__' in k), 'triton': b['triton']}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=AIRFLOW_HOME)
    assert out.returncode == 0, out.stderr[-2000:]
    form = json.loads(out.stdout.strip().splitlines()[-1])
    assert form["widgets"] == [
        "extra__mlflow__token",
        "extra__mlflow__tracking_uri",
        "extra__triton__grpc_endpoints",
        "extra__triton__http_endpoints",
        "extra__triton__repository",
        "extra__triton__store_conn_id",
    ]
    assert form["sensitive"] == ["extra__mlflow__token"]
    assert form["triton"]["relabeling"]["password"] == "Model-control key"
    assert set(form["triton"]["hidden_fields"]) == {"schema", "login"}
    print(f"\nairflow providers list + hooks + ProvidersManager: {time.perf_counter() - t0:.1f}s")


# ----------------------------------------------------------------------------- Triton


def _conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, **conn) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    return conn_id


@pytest.mark.slow
@pytest.mark.integration
def test_triton_test_connection_against_a_real_triton(server, monkeypatch: pytest.MonkeyPatch) -> None:
    from seqcls.airflow.hooks import TritonHook
    from seqcls.serving.client import TritonOps

    cfg = server.config
    extra = {"grpc_endpoints": cfg.grpc_url, "http_endpoints": cfg.http_url, "repository": str(cfg.repository)}
    ok = _conn(monkeypatch, "t_ok", conn_type="triton", password=server.control_key, extra=extra)
    t0 = time.perf_counter()
    status, message = TritonHook(ok).test_connection()
    assert status, message
    assert f"{cfg.grpc_url} live, model control accepted the key" in message, message
    assert f"HTTP {cfg.http_url} live" in message
    assert "the Connection's password" in message and f"repository {cfg.repository}: exists here" in message
    assert server.control_key not in message
    # a generic Connection (as before the provider) works the same; the key from the repository's key file
    generic = _conn(monkeypatch, "t_generic", conn_type="generic", extra=extra)
    status, message = TritonHook(generic).test_connection()
    assert status and "SEQCLS_TRITON_CONTROL_KEY / the repository's key file" in message, message
    # the real client: one TritonOps per replica, tritonclient's gRPC client inside, the key on control calls
    (ops,) = TritonHook(ok).get_conn()
    assert isinstance(ops, TritonOps) and ops.live() and ops.endpoint.control_key == server.control_key
    assert type(ops.client._raw).__module__.startswith("tritonclient.grpc")
    assert "error" not in ops.index_states()  # the repository index, with the key

    wrong_key = _conn(monkeypatch, "t_key", conn_type="triton", password="w" * 32, extra=extra)
    status, message = TritonHook(wrong_key).test_connection()
    assert not status and "refused model control" in message and "the control key sent is wrong" in message, message
    assert "w" * 32 not in message

    (dead,) = free_ports(1)
    bad = {**extra, "grpc_endpoints": f"127.0.0.1:{dead}", "http_endpoints": ""}
    wrong_grpc = _conn(monkeypatch, "t_grpc", conn_type="triton", password=server.control_key, extra=bad)
    status, message = TritonHook(wrong_grpc).test_connection()
    assert not status and f"Triton is not answering at 127.0.0.1:{dead} (gRPC)" in message, message

    bad = {**extra, "http_endpoints": f"127.0.0.1:{dead}"}
    wrong_http = _conn(monkeypatch, "t_http", conn_type="triton", password=server.control_key, extra=bad)
    status, message = TritonHook(wrong_http).test_connection()
    assert not status and f"HTTP 127.0.0.1:{dead} is not answering" in message, message

    uneven = {**extra, "http_endpoints": f"{cfg.http_url},127.0.0.1:{dead}"}
    status, message = TritonHook(_conn(monkeypatch, "t_uneven", conn_type="triton", extra=uneven)).test_connection()
    assert not status and "one of each per Triton replica" in message, message
    print(f"\nTriton test_connection x6: {time.perf_counter() - t0:.1f}s")


# ----------------------------------------------------------------------------- MLflow


class _Refusing(BaseHTTPRequestHandler):
    """An MLflow stand-in that refuses every request (HTTP 401) and remembers the Authorization header."""

    seen: list[str | None] = []  # noqa: RUF012 — per-class record, reset by the test

    def do_GET(self) -> None:  # MLflow's registry search is a GET
        self.seen.append(self.headers.get("Authorization"))
        body = b'{"error_code": "UNAUTHENTICATED", "message": "You are not authenticated."}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args) -> None:
        pass


@pytest.mark.slow
@pytest.mark.integration
def test_mlflow_test_connection_against_a_real_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    from seqcls.airflow.hooks import MlflowHook

    uri = f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    t0 = time.perf_counter()
    ok = _conn(monkeypatch, "m_ok", conn_type="mlflow", extra={"tracking_uri": uri})
    client = MlflowHook("m_ok").get_conn()  # the store, created as a release's first MLflow call does
    assert isinstance(client, MlflowClient) and client.search_registered_models(max_results=1) == []
    status, message = MlflowHook(ok).test_connection()
    assert status and f"the model registry at {uri} answered" in message, message
    generic = _conn(monkeypatch, "m_generic", conn_type="generic", extra={"tracking_uri": uri})
    assert MlflowHook(generic).test_connection()[0]
    t_ok = time.perf_counter() - t0

    (dead,) = free_ports(1)
    t1 = time.perf_counter()
    wrong = _conn(monkeypatch, "m_dead", conn_type="mlflow", host="127.0.0.1", port=dead)
    status, message = MlflowHook(wrong).test_connection()
    took = time.perf_counter() - t1
    assert not status and f"MLflow at http://127.0.0.1:{dead} did not answer the registry call" in message, message
    assert took < 20, f"a dead MLflow took {took:.0f}s to report (its HTTP retries must be off for the test)"

    _Refusing.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    secret = "pw-" + "9" * 20
    try:
        conn = {"conn_type": "mlflow", "host": "127.0.0.1", "port": httpd.server_port}
        refusing = _conn(monkeypatch, "m_401", **conn, login="rel", password=secret)
        status, message = MlflowHook(refusing).test_connection()
    finally:
        httpd.shutdown()
    assert not status and "refused the credentials" in message, message
    assert "set the Connection's login and password, or a token" in message
    assert secret not in message
    assert _Refusing.seen and _Refusing.seen[0] == "Basic " + base64.b64encode(f"rel:{secret}".encode()).decode()
    assert not any(os.environ.get(v) for v in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"))
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # scoped to the call
    print(f"\nMLflow test_connection: sqlite {t_ok:.1f}s, dead endpoint {took:.1f}s")
