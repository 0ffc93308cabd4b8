"""MLflow registry: one version per (fingerprint, serving configuration) with lineage, promote/undo,
MLflow failures that are not "not found", real tracking server."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from seqcls.config import FIELDS, ReleaseConfig
from seqcls.errors import GateError, RegistryError, StepOrderError
from seqcls.registry import ledger as registry
from seqcls.registry.ledger import CHAMPION
from seqcls.release.intake import open_release
from seqcls.release.keys import DEPLOYMENT_PARAMS, GATE_ONLY_PARAMS, SERVING_PARAMS, key_of, release_key, serving_config
from seqcls.release.records import Expected, Registered
from seqcls.release.workspace import Release, Workspace
from seqcls.settings import Settings
from seqcls.steps import run_release
from seqcls.steps.promote import promote
from seqcls.steps.register import register

pytestmark = pytest.mark.slow


def _validated(ckpt: Path, settings: Settings | None = None, **config) -> Release:
    release = open_release(ckpt, ReleaseConfig(**config), settings=settings)
    run_release(release, until="evaluate")
    return release


def _fake_served(release: Release, version: int) -> None:
    """Record publish/smoke as done and the version as served (promote's preconditions) without a Triton server."""
    from seqcls.serving.state import current_state, write_state

    release.workspace.mark("publish", status="ok", summary={"version": version})
    release.workspace.mark("smoke", status="ok", summary={"version": version})
    repo = release.settings.triton_repository
    state = current_state(repo, release.config.model_name)
    served = state.with_candidate(version, release.checkpoint.fingerprint, "test").promoted(
        version, release.checkpoint.fingerprint, "test"
    )
    write_state(repo, served, expected_generation=state.generation)


def _aliases(c, name: str) -> dict[str, int]:
    return {a: int(v) for a, v in c.get_registered_model(name).aliases.items()}


def test_register_idempotent_with_lineage_and_loadable(tiny_checkpoint: Path, tiny_checkpoint_b: Path) -> None:
    import mlflow.pyfunc

    release = _validated(tiny_checkpoint)
    first = register(release)
    again = register(release)
    assert first.summary["created"] and not again.summary["created"]
    assert first.summary["version"] == again.summary["version"] == 1
    c = registry.client(release.settings)
    assert len(c.search_model_versions("name = 'seqcls'")) == 1
    second = register(_validated(tiny_checkpoint_b))
    assert second.summary["version"] == 2 and len(c.search_model_versions("name = 'seqcls'")) == 2
    assert _aliases(c, "seqcls") == {"candidate": 2}

    mv = c.get_model_version("seqcls", "1")
    for tag in (
        "fingerprint",
        "opset",
        "version.paddlepaddle",
        "version.paddle2onnx",
        "version.onnx",
        "version.onnxruntime",
        "version.paddlenlp",
        "seqcls_version",
        "parity.logits_max_abs_diff",
    ):
        assert mv.tags.get(tag), tag
    assert mv.tags["fingerprint"] == release.checkpoint.fingerprint
    run = c.get_run(mv.run_id)
    assert run.data.metrics["numeric.logits_max_abs_diff"] < 1e-4 and run.data.metrics["decisions.agreement"] == 1.0
    assert run.data.params["fingerprint"] == release.checkpoint.fingerprint
    artifacts = {a.path for a in c.list_artifacts(mv.run_id)}
    assert {"paddle_static", "parity", "tokenizer", "checkpoint"} <= artifacts

    # models:/seqcls@candidate is the pyfunc: texts in, the second release's validated decisions out
    expected = Expected.load(Workspace(Path(second.workspace)))
    out = mlflow.pyfunc.load_model("models:/seqcls@candidate").predict([item.text for item in expected.items[:4]])
    assert out["labels"].tolist() == [item.labels for item in expected.items[:4]]
    got, want = np.array(out["probabilities"].tolist()), np.array([item.probabilities for item in expected.items[:4]])
    np.testing.assert_allclose(got, want, atol=expected.prob_atol)


def test_promote_and_undo(tiny_checkpoint: Path, tiny_checkpoint_b: Path) -> None:
    a, b = _validated(tiny_checkpoint), _validated(tiny_checkpoint_b)
    register(a)
    _fake_served(a, 1)
    pa = promote(a)
    assert pa.summary["version"] == 1 and pa.summary["previous"] is None
    assert promote(a).summary["already"]  # safe to repeat
    c = registry.client(a.settings)
    register(b)
    _fake_served(b, 2)
    pb = promote(b)
    assert pb.summary["previous"] == 1
    assert _aliases(c, "seqcls") == {"champion": 2, "previous-champion": 1, "candidate": 2}
    assert registry.champion_fingerprint(b.settings, "seqcls") == b.checkpoint.fingerprint
    history = json.loads(c.get_registered_model("seqcls").tags["champion_history"])
    assert [h["champion"] for h in history] == [1, 2]

    undone = registry.undo(b, reason="smoke failed later")
    assert undone["changed"] and _aliases(c, "seqcls")["champion"] == 1
    assert "previous-champion" not in _aliases(c, "seqcls")
    assert c.get_model_version("seqcls", "2").tags["seqcls.rolled_back"]  # was champion: kept, tagged
    assert not registry.undo(b)["changed"]  # safe to repeat


def test_failed_release_leaves_registry_exactly_as_it_was(tiny_checkpoint: Path, tiny_checkpoint_b: Path) -> None:
    a = _validated(tiny_checkpoint)
    register(a)
    _fake_served(a, 1)
    promote(a)
    c = registry.client(a.settings)
    before = (_aliases(c, "seqcls"), sorted(v.version for v in c.search_model_versions("name = 'seqcls'")))
    b = _validated(tiny_checkpoint_b)
    register(b)  # a new version + candidate alias ...
    registry.undo(b, reason="reload failed")  # ... that a failed release takes back
    after = (_aliases(c, "seqcls"), sorted(v.version for v in c.search_model_versions("name = 'seqcls'")))
    assert after == before
    run_id = b.workspace.step("register")["summary"]["run_id"]
    assert c.get_run(run_id).data.tags["seqcls.outcome"] == "rolled_back"  # the audit trail stays


def test_failed_gate_registers_nothing(tiny_checkpoint: Path, home: Path) -> None:
    vocab = (tiny_checkpoint / "vocab.txt").read_text(encoding="utf-8").splitlines()
    vocab[vocab.index("公")] = "公 "
    (tiny_checkpoint / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    release = open_release(tiny_checkpoint)
    with pytest.raises(GateError):
        run_release(release)
    assert release.workspace.step("register") is None
    c = registry.client(release.settings)
    assert c.search_registered_models() == []


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    from seqcls.localtriton import free_port

    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log_file = open(tmp_path / "mlflow.log", "wb")  # noqa: SIM115 (closed after the server stops)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{tmp_path}/server.db",
            "--artifacts-destination",
            str(tmp_path / "server-artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(0.5)
        assert proc.poll() is None, (tmp_path / "mlflow.log").read_text()[-2000:]
    else:
        pytest.fail("mlflow server did not become healthy in 90 s")
    yield url
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log_file.close()


@pytest.mark.integration
def test_against_real_mlflow_server(mlflow_server: str, tiny_checkpoint: Path, home: Path) -> None:
    import mlflow.pyfunc

    settings = Settings(home=home, mlflow_tracking_uri=mlflow_server)
    release = _validated(tiny_checkpoint, settings)
    assert registry.alias_version(settings, "seqcls", CHAMPION) is None  # REST: no such model → None
    result = register(release)
    assert result.summary["version"] == 1
    assert registry.alias_version(settings, "seqcls", CHAMPION) is None  # REST: no such alias → None
    assert register(release).summary["created"] is False
    key = release_key(release)
    assert registry.find_version(registry.client(settings), "seqcls", None, release_key=key).version == "1"
    _fake_served(release, 1)
    promoted = promote(release)
    assert promoted.summary["url"] == f"{mlflow_server}/#/models/seqcls/versions/1"
    assert registry.champion_fingerprint(settings, "seqcls") == release.checkpoint.fingerprint
    mlflow.set_tracking_uri(mlflow_server)
    expected = Expected.load(release.workspace)  # the pyfunc's artifacts come back through the server
    answer = mlflow.pyfunc.load_model("models:/seqcls@champion").predict([expected.items[0].text])
    assert answer["labels"].tolist() == [expected.items[0].labels]
    assert not list((home / "mlflow").glob("*.db"))  # nothing fell back to the local store


# ----------------------------------------------------------------------------- release key (issue 12)


def test_release_key_fields_are_decided_for_every_parameter() -> None:
    served, gate_only, deployment = set(SERVING_PARAMS), set(GATE_ONLY_PARAMS), set(DEPLOYMENT_PARAMS)
    assert not served & gate_only and not deployment & (served | gate_only)
    # a new release parameter must be put on one side (model_name names the registered model itself)
    assert served | gate_only | deployment | {"model_name"} == {f.name for f in FIELDS}


@pytest.mark.parametrize(
    ("change", "same"),
    [
        ({"threshold": 0.7}, False),
        ({"thresholds": {"体育": 0.6}}, False),
        ({"profile": "int8"}, False),
        ({"opset": 13}, False),
        ({"max_length": 64}, False),
        ({"hierarchy": False}, False),
        (
            {
                **{"atol": 1e-3, "rtol": 1e-2, "prob_atol": 0.01, "provider": "cpu", "min_decision_agreement": 0.9},
                **{"override": "parity", "override_reason": "looser tolerances, taken knowingly"},
            },
            True,
        ),
        ({"thresholds": {"体育": 0.5}}, True),  # spelled differently, served the same
    ],
)
def test_release_key_changes_with_what_is_served_only(tiny_checkpoint: Path, change: dict, same: bool) -> None:
    base = open_release(tiny_checkpoint)
    assert "体育" in base.checkpoint.labels
    other = dataclasses.replace(base, config=ReleaseConfig(**change))
    key = release_key(base)
    assert len(key) == 16 and int(key, 16) >= 0
    assert (release_key(other) == key) is same
    assert release_key(base) == key  # stable
    config = serving_config(dataclasses.replace(base, config=ReleaseConfig(threshold=0.7)))
    assert set(config["thresholds"].values()) == {0.7}  # float32 written readably, not 0.699999988


def _serving_config(mv) -> dict:
    return json.loads(mv.tags["serving_config"])


def test_one_version_per_serving_configuration(tiny_checkpoint: Path) -> None:
    at05 = _validated(tiny_checkpoint)
    key05 = release_key(at05)
    assert register(at05).summary["version"] == 1
    at07 = _validated(tiny_checkpoint, threshold=0.7)  # same checkpoint, same workspace: validate re-runs
    key07 = release_key(at07)
    assert key07 != key05
    with pytest.raises(StepOrderError, match="thresholds"):
        register(at05)  # the workspace is now validated at 0.7: registering it as 0.5 would lie
    second = register(at07)
    assert second.summary["created"] and second.summary["version"] == 2 and second.summary["release_key"] == key07
    again = register(at07)
    assert not again.summary["created"] and again.summary["version"] == 2  # same key: reused

    c = registry.client(at07.settings)
    v1, v2 = c.get_model_version("seqcls", "1"), c.get_model_version("seqcls", "2")
    assert (v1.tags["release_key"], v2.tags["release_key"]) == (key05, key07)
    assert set(_serving_config(v1)["thresholds"].values()) == {0.5}
    assert set(_serving_config(v2)["thresholds"].values()) == {0.7}
    assert key_of(_serving_config(v2)) == key07  # the tag is the key's preimage
    assert _serving_config(v2)["fingerprint"] == v1.tags["fingerprint"] == at07.checkpoint.fingerprint
    assert c.get_run(v2.run_id).data.params["release_key"] == key07

    _fake_served(at07, 2)
    promoted = promote(at07)
    assert promoted.summary["version"] == 2 and promoted.summary["release_key"] == key07
    with pytest.raises(StepOrderError, match="serving configuration"):
        promote(at05)  # the workspace's registration is 0.7's, not 0.5's

    fp = at05.checkpoint.fingerprint
    moved = registry.mirror_champion(at05.settings, "seqcls", fp, 1, release_key=key05)
    assert moved["champion"] == 1 and _aliases(c, "seqcls")["champion"] == 1
    moved = registry.mirror_champion(at05.settings, "seqcls", fp, 2, release_key=key07)
    assert moved["champion"] == 2 and moved["previous"] == 1
    assert registry.champion_release_key(at05.settings, "seqcls") == key07
    assert registry.registered_version(at05.settings, "seqcls", fp, release_key=key05) == 1  # what status expects
    missing = registry.mirror_champion(at05.settings, "seqcls", fp, 3, release_key="0" * 16)
    assert missing["missing"] and _aliases(c, "seqcls")["champion"] == 2  # keyed versions hold other configs

    tags = {int(v.version): v.tags for v in c.search_model_versions("name = 'seqcls'")}
    assert "champion_since" in tags[2] and "champion_since" not in tags[1]  # only the champion says since when

    assert _aliases(c, "seqcls")["candidate"] == 2
    back = _validated(tiny_checkpoint)  # 0.5 again: validate re-runs, the first version is reused
    assert register(back).summary["version"] == 1 and not register(back).summary["created"]
    assert len(c.search_model_versions("name = 'seqcls'")) == 2
    assert _aliases(c, "seqcls")["candidate"] == 1  # the candidate follows the attempt, also a reused version
    again = c.get_model_version("seqcls", "1").tags
    assert again["checkpoint"] == str(back.checkpoint.origin) and again["released_at"] >= tags[1]["released_at"]


def test_legacy_version_without_release_key_is_found_by_fingerprint(tiny_checkpoint: Path) -> None:
    release = _validated(tiny_checkpoint)
    key, fp = release_key(release), release.checkpoint.fingerprint
    register(release)
    c = registry.client(release.settings)
    for tag in ("release_key", "serving_config"):  # as registered before release keys existed
        c.delete_model_version_tag("seqcls", "1", tag)

    moved = registry.mirror_champion(release.settings, "seqcls", fp, 1, release_key=key)
    assert moved["champion"] == 1  # no version has the key: the legacy version of the fingerprint
    assert registry.mirror_champion(release.settings, "seqcls", fp, 1)["already"]  # no key at all: same

    new = register(release)  # a legacy version's serving configuration is unknown: never reused
    assert new.summary["created"] and new.summary["version"] == 2
    assert registry.mirror_champion(release.settings, "seqcls", fp, 1, release_key=key)["champion"] == 2
    assert registry.mirror_champion(release.settings, "seqcls", fp, 1)["champion"] == 1  # legacy first
    assert registry.mirror_champion(release.settings, "seqcls", None, 1)["missing"]


# ----------------------------------------------------------------------------- MLflow failures (issue 13)


class _FailingClient:
    """An MlflowClient whose every registry read fails with ``exc``; records any write."""

    def __init__(self, exc: Exception) -> None:
        self.exc, self.writes = exc, []

    def get_model_version_by_alias(self, name, alias):
        raise self.exc

    def search_model_versions(self, filter_string):
        raise self.exc

    def get_registered_model(self, name):
        raise self.exc

    def __getattr__(self, name):  # set_registered_model_alias, delete_model_version, ...
        return lambda *args, **kwargs: self.writes.append(name)


def _mlflow_error(message: str, code: str) -> Exception:
    from mlflow.exceptions import MlflowException
    from mlflow.protos import databricks_pb2

    return MlflowException(message, error_code=getattr(databricks_pb2, code))


def _rest_error(status_body: dict) -> Exception:
    from mlflow.exceptions import RestException

    return RestException(status_body)


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(lambda: _mlflow_error("database is locked", "INTERNAL_ERROR"), id="internal"),
        pytest.param(lambda: _mlflow_error("(sqlite3.OperationalError) database is locked", "TEMPORARILY_UNAVAILABLE")),
        pytest.param(lambda: _rest_error({"error_code": "INTERNAL_ERROR", "message": "database is locked"}), id="5xx"),
        pytest.param(lambda: _rest_error({"error_code": "503", "message": "database is locked"}), id="http-503"),
        pytest.param(lambda: _mlflow_error("database is locked (endpoint not found)", "ENDPOINT_NOT_FOUND")),
    ],
)
def test_an_mlflow_failure_is_not_alias_not_set(exc, tiny_checkpoint: Path, monkeypatch) -> None:
    fake = _FailingClient(exc())
    monkeypatch.setattr(registry, "client", lambda settings: fake)
    with pytest.raises(RegistryError, match=r"MLflow failed reading alias 'champion'.*database is locked"):
        registry.aliased_version(fake, "seqcls", "champion")
    with pytest.raises(RegistryError, match="database is locked"):
        registry.find_version(fake, "seqcls", "f" * 64, release_key="0" * 16)
    settings = Settings()
    with pytest.raises(RegistryError):
        registry.alias_version(settings, "seqcls", "champion")
    with pytest.raises(RegistryError):
        registry.set_champion(settings, "seqcls", 3, 3)
    with pytest.raises(RegistryError):
        registry.mirror_champion(settings, "seqcls", "f" * 64, 3, release_key="0" * 16)
    release = open_release(tiny_checkpoint)
    release.workspace.mark("register", status="ok", summary=Registered("seqcls", 3, created=True).to_dict())
    with pytest.raises(RegistryError):
        registry.undo(release, reason="smoke failed")
    assert fake.writes == []  # nothing acted on wrong information
    assert not Registered.load(release.workspace).undone  # a later undo still knows what to take back


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(lambda: _mlflow_error("Registered model alias champion not found.", "INVALID_PARAMETER_VALUE")),
        pytest.param(lambda: _mlflow_error("Registered Model with name=seqcls not found", "RESOURCE_DOES_NOT_EXIST")),
        pytest.param(
            lambda: _rest_error({"error_code": "INVALID_PARAMETER_VALUE", "message": "alias champion not found."}),
            id="rest",
        ),
    ],
)
def test_a_missing_alias_or_model_is_none(exc) -> None:
    assert registry.aliased_version(_FailingClient(exc()), "seqcls", "champion") is None


def test_find_version_scans_only_when_the_tag_filter_is_rejected() -> None:
    class NoTagFilter:
        def search_model_versions(self, filter_string):
            if "tags." in filter_string:
                raise _mlflow_error("Invalid attribute key 'tags.release_key'", "INVALID_PARAMETER_VALUE")
            tagged = type("MV", (), {"version": "4", "tags": {"release_key": "k" * 16, "fingerprint": "f"}})
            return [tagged, type("MV", (), {"version": "2", "tags": {"fingerprint": "f"}})]

    assert registry.find_version(NoTagFilter(), "seqcls", "f", release_key="k" * 16).version == "4"
    assert registry.find_version(NoTagFilter(), "seqcls", "f", release_key="x" * 16).version == "2"  # legacy
    assert registry.find_version(NoTagFilter(), "seqcls", "g") is None


@pytest.fixture
def broken_mlflow(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    """An HTTP "MLflow server" answering every call with the status and body in ``reply`` (no retries)."""
    reply = {"status": 500, "body": b"", "type": "application/json"}

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.send_response(reply["status"])
            self.send_header("Content-Type", reply["type"])
            self.send_header("Content-Length", str(len(reply["body"])))
            self.end_headers()
            self.wfile.write(reply["body"])

        do_GET = do_POST = do_PATCH = do_DELETE = _answer

        def log_message(self, *args) -> None:
            pass

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    reply["url"] = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield reply
    httpd.shutdown()
    httpd.server_close()


def test_rest_5xx_is_a_registry_error_and_a_rest_not_found_is_none(broken_mlflow: dict, home: Path) -> None:
    settings = Settings(home=home, mlflow_tracking_uri=broken_mlflow["url"])
    broken_mlflow["body"] = json.dumps({"error_code": "INTERNAL_ERROR", "message": "database is locked"}).encode()
    with pytest.raises(RegistryError, match=r"MLflow failed reading alias 'champion'.*too many 500 error responses"):
        registry.alias_version(settings, "seqcls", "champion")  # the client's retries gave up on the 5xx
    broken_mlflow.update(
        status=403, body=json.dumps({"error_code": "PERMISSION_DENIED", "message": "no access to seqcls"}).encode()
    )
    with pytest.raises(RegistryError, match="PERMISSION_DENIED: no access to seqcls"):
        registry.alias_version(settings, "seqcls", "champion")  # not retried: MLflow's own message
    broken_mlflow.update(status=503, body=b"<html>Service Unavailable</html>", type="text/html")  # a proxy's 5xx
    with pytest.raises(RegistryError, match="MLflow failed"):
        registry.alias_version(settings, "seqcls", "champion")
    with pytest.raises(RegistryError, match="MLflow failed"):
        registry.mirror_champion(settings, "seqcls", "f" * 64, 1, release_key="0" * 16)
    broken_mlflow.update(
        status=404,
        body=json.dumps({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "Registered Model not found"}).encode(),
        type="application/json",
    )
    assert registry.alias_version(settings, "seqcls", "champion") is None
