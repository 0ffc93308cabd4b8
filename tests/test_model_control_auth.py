"""Authenticated model control: Triton's model-repository API needs the control key, nothing else does.

Unit tests (no server): the client sends the key on load/unload/index only, a refusal is one
:class:`~seqcls.serving.client.ControlRefused` naming the setting (never retried), the key stays out
of ``repr``. Then one real local Triton for the module, serving a released tiny model: raw tritonclient
calls without the key are refused over gRPC and HTTP, with it they work; health, metadata and inference
stay open; a ``seqcls reload`` with a wrong key fails naming the setting and changes nothing served; the
key is in no log, manifest or record seqcls writes.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from seqcls.contract.names import ModelName
from seqcls.localtriton import LocalTriton, TritonServerConfig, free_ports
from seqcls.release.intake import open_release
from seqcls.serving.client import ControlRefused, Endpoint, TritonOps, endpoints_from_settings
from seqcls.settings import CONTROL_KEY_FILE, ENV_TRITON_CONTROL_KEY, Settings
from seqcls.steps import run_release
from seqcls.steps.smoke import infer
from tests.helpers.triton import start_triton

KEY = "unit-test-key-" + "0123456789abcdef" * 2
WRONG = "wrong-key-" + "fedcba9876543210" * 2
RESTRICTED = "This protocol is restricted, expecting header 'triton-grpc-protocol-triton-control-key'"


@pytest.fixture(autouse=True)
def _no_key_from_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_TRITON_CONTROL_KEY, raising=False)


# ----------------------------------------------------------------------------- unit


class FakeClient:
    """Records every call's keyword arguments; control calls fail like Triton 2.51 when told to."""

    def __init__(self, refuse: bool = False) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.refuse = refuse

    def __getattr__(self, name: str):
        def call(*args: Any, **kwargs: Any) -> Any:
            from tritonclient.utils import InferenceServerException

            self.calls.append((name, kwargs))
            if self.refuse and name in ("load_model", "unload_model", "get_model_repository_index"):
                raise InferenceServerException(RESTRICTED, status="StatusCode.UNAVAILABLE")
            return {"models": []} if name == "get_model_repository_index" else True

        return call


def _ops(raw: FakeClient, key: str | None) -> TritonOps:
    ops = TritonOps(Endpoint("127.0.0.1:1", control_key=key))
    from seqcls.serving.client import ControlClient

    ops.__dict__["client"] = ControlClient(raw, ops.endpoint)
    return ops


def test_the_key_goes_on_model_control_calls_only() -> None:
    raw = FakeClient()
    ops = _ops(raw, KEY)
    ops.load("m")
    ops.index_states()
    ops.ready("m")
    ops.live()
    ops.metadata("m")
    ops.client.unload_model("m")
    headers = {name: kwargs.get("headers") for name, kwargs in raw.calls}
    sent = {"triton-grpc-protocol-triton-control-key": KEY}
    assert headers == {
        "load_model": sent,
        "get_model_repository_index": sent,
        "unload_model": sent,
        "is_model_ready": None,
        "is_server_live": None,
        "get_model_metadata": None,
    }


def test_a_refusal_names_the_setting_and_is_not_retried() -> None:
    raw = FakeClient(refuse=True)
    with pytest.raises(ControlRefused) as err:
        _ops(raw, WRONG).load("seqcls_model")
    text = str(err.value)
    assert text.index(ENV_TRITON_CONTROL_KEY) < 200, "the setting must survive callers cutting at 300 chars"
    assert "the control key sent is wrong" in text and "Triton Connection's password" in text
    assert "load model 'seqcls_model'" in text and WRONG not in text
    assert [name for name, _ in raw.calls] == ["load_model"], "retried a refusal"
    with pytest.raises(ControlRefused, match="no control key is set"):
        _ops(FakeClient(refuse=True), None).client.get_model_repository_index()


def test_endpoints_carry_the_settings_key_but_never_show_it(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, triton_grpc=("127.0.0.1:9001", "127.0.0.2:9001"), triton_control_key=KEY)
    endpoints = endpoints_from_settings(settings)
    assert [e.control_key for e in endpoints] == [KEY, KEY]
    assert endpoints[0] == Endpoint("127.0.0.1:9001", "127.0.0.1:8000")  # the key is not identity
    assert KEY not in repr(endpoints) + repr(settings) + repr(TritonOps(endpoints[0]))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / CONTROL_KEY_FILE).write_text(WRONG + "\n")
    from_file = Settings(home=tmp_path, triton_repository=repo)
    assert endpoints_from_settings(from_file)[0].control_key == WRONG
    assert endpoints_from_settings(from_file, grpc=["127.0.0.9:1"])[0].control_key == WRONG  # --grpc too


# ----------------------------------------------------------------------------- one real Triton


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("control-auth")


OPEN: list[Any] = []  # clients closed before the server stops (open connections delay its exit)


def _grpc(triton: LocalTriton):
    import tritonclient.grpc as grpcclient

    OPEN.append(grpcclient.InferenceServerClient(triton.grpc_url))
    return OPEN[-1]


def _http(triton: LocalTriton):
    import tritonclient.http as httpclient

    OPEN.append(httpclient.InferenceServerClient(triton.http_url))
    return OPEN[-1]


def _op(settings: Settings) -> TritonOps:
    op = TritonOps(endpoints_from_settings(settings)[0])
    OPEN.append(op.client)
    return op


@pytest.fixture(scope="module")
def triton(root: Path) -> Iterator[LocalTriton]:
    server = start_triton(root)
    yield server
    while OPEN:
        OPEN.pop().close()
    server.stop()


@pytest.fixture(scope="module")
def settings(triton: LocalTriton, root: Path) -> Settings:
    cfg = triton.config
    return Settings(
        home=root / "home",
        triton_repository=cfg.repository,
        triton_grpc=(cfg.grpc_url,),
        triton_http=(cfg.http_url,),
        mlflow_tracking_uri=f"sqlite:///{root / 'mlflow.db'}",
    )


@pytest.fixture(scope="module")
def served(settings: Settings, tiny_checkpoint_src: Path) -> dict[str, Any]:
    """Version 1 of the tiny model released (with the key the library found by itself)."""
    results = run_release(open_release(tiny_checkpoint_src, settings=settings))
    return {r.step: r for r in results}


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_TRITON_CONTROL_KEY}
    env.update(
        SEQCLS_HOME=str(settings.home),
        SEQCLS_TRITON_REPOSITORY=str(settings.triton_repository),
        SEQCLS_TRITON_GRPC=settings.triton_grpc[0],
        SEQCLS_TRITON_HTTP=settings.triton_http[0],
        SEQCLS_MLFLOW_TRACKING_URI=str(settings.mlflow_tracking_uri),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def _cli(settings: Settings, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "seqcls.cli", *args],
        env=_env(settings, **extra),
        capture_output=True,
        text=True,
        timeout=900,
    )


def _ready(triton: LocalTriton) -> dict[str, list[str]]:
    index = _grpc(triton).get_model_repository_index(headers=triton.control_headers())
    out: dict[str, list[str]] = {}
    for m in index.models:
        if m.state == "READY":
            out.setdefault(m.name, []).append(m.version)
    return out


@pytest.mark.slow
@pytest.mark.integration
def test_the_local_key_is_generated_private_and_found_by_the_library(
    triton: LocalTriton, settings: Settings, served: dict[str, Any]
) -> None:
    path = triton.config.repository / CONTROL_KEY_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    assert triton.control_key == path.read_text().strip() == settings.control_key()
    assert served["promote"].status != "failed" and _ready(triton)["seqcls"] == ["1"]


@pytest.mark.slow
@pytest.mark.integration
def test_model_control_without_the_key_is_refused_over_grpc_and_http(triton: LocalTriton, served) -> None:
    from tritonclient.utils import InferenceServerException

    grpc, http = _grpc(triton), _http(triton)
    wrong_grpc = {"triton-grpc-protocol-triton-control-key": WRONG}
    refusals = {
        "grpc load": lambda: grpc.load_model("seqcls"),
        "grpc load, wrong key": lambda: grpc.load_model("seqcls", headers=wrong_grpc),
        "grpc load, the HTTP header name": lambda: grpc.load_model("seqcls", headers=triton.control_headers("http")),
        "grpc unload": lambda: grpc.unload_model("seqcls"),
        "grpc index": lambda: grpc.get_model_repository_index(),
        "http load": lambda: http.load_model("seqcls"),
        "http load, wrong key": lambda: http.load_model("seqcls", headers={"triton-control-key": WRONG}),
        "http unload": lambda: http.unload_model("seqcls"),
        "http index": lambda: http.get_model_repository_index(),
    }
    for what, call in refusals.items():
        with pytest.raises(InferenceServerException, match="restricted, expecting header") as err:
            call()
        expected = "StatusCode.UNAVAILABLE" if what.startswith("grpc") else "403"
        assert err.value.status() == expected, what
    assert _ready(triton)["seqcls"] == ["1"], "a refused unload changed what is served"
    # with the key: load works on both protocols (the ensemble reloads its recorded version)
    grpc.load_model("seqcls", headers=triton.control_headers("grpc"))
    http.load_model("seqcls", headers=triton.control_headers("http"))
    assert _ready(triton)["seqcls"] == ["1"]


@pytest.mark.slow
@pytest.mark.integration
def test_health_metadata_and_inference_stay_open(triton: LocalTriton, served) -> None:
    grpc, http = _grpc(triton), _http(triton)
    assert grpc.is_server_live() and grpc.is_server_ready() and grpc.is_model_ready("seqcls", "1")
    assert http.is_server_live() and http.is_server_ready() and http.is_model_ready("seqcls")
    assert grpc.get_model_metadata("seqcls", as_json=True)["name"] == "seqcls"
    assert http.get_server_metadata()["version"] == "2.51.0"
    assert grpc.get_inference_statistics("seqcls", as_json=True)["model_stats"]
    preds, probs = infer(grpc, ["公司宣布裁员一千人"])  # a raw client, no key: inference is open
    assert len(preds) == 1 and probs.shape[0] == 1 and np.all((probs >= 0) & (probs <= 1))


@pytest.mark.slow
@pytest.mark.integration
def test_repository_index_with_the_key(triton: LocalTriton, settings: Settings, served) -> None:
    index = _http(triton).get_model_repository_index(headers=triton.control_headers("http"))
    assert {(m["name"], m.get("version"), m.get("state")) for m in index} >= {("seqcls", "1", "READY")}
    op = _op(settings)
    op.require_live()  # liveness and the key
    assert op.index_states("seqcls") == {"seqcls/1": "READY"}


@pytest.mark.slow
@pytest.mark.integration
def test_reload_with_a_wrong_key_fails_naming_the_setting_and_changes_nothing(
    triton: LocalTriton, settings: Settings, served, tiny_checkpoint_b_src: Path
) -> None:
    from seqcls.serving.state import current_state

    published = _cli(settings, "release", "--checkpoint", str(tiny_checkpoint_b_src), "--until", "publish")
    assert published.returncode == 0, published.stderr[-3000:]  # the CLI found the local key by itself
    before = (_ready(triton), current_state(settings.triton_repository, ModelName("seqcls")))
    answer = infer(_op(settings), ["公司宣布裁员一千人"])[0]

    refused = _cli(settings, "reload", "--checkpoint", str(tiny_checkpoint_b_src), **{ENV_TRITON_CONTROL_KEY: WRONG})
    assert refused.returncode == 1, refused.stdout + refused.stderr
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ") and "refused model control" in error, refused.stderr[-3000:]
    assert ENV_TRITON_CONTROL_KEY in error and "Triton Connection's password" in error
    assert WRONG not in refused.stdout + refused.stderr and triton.control_key not in refused.stdout + refused.stderr
    after = (_ready(triton), current_state(settings.triton_repository, ModelName("seqcls")))
    assert after == before, "a refused reload changed what is served or recorded"
    assert infer(_op(settings), ["公司宣布裁员一千人"])[0] == answer

    # with the right key (the file again) the same command works; rollback leaves version 1 served
    assert _cli(settings, "reload", "--checkpoint", str(tiny_checkpoint_b_src)).returncode == 0
    assert _ready(triton)["seqcls_candidate"] == ["2"]
    rolled = _cli(settings, "rollback", "--checkpoint", str(tiny_checkpoint_b_src))
    assert rolled.returncode == 0, rolled.stderr[-3000:]
    assert _ready(triton)["seqcls"] == ["1"] and "seqcls_candidate" not in _ready(triton)


@pytest.mark.slow
@pytest.mark.integration
def test_the_key_is_in_no_log_manifest_or_record(triton: LocalTriton, settings: Settings, served, root: Path) -> None:
    key = str(triton.control_key).encode()
    key_file = triton.config.repository / CONTROL_KEY_FILE
    server_copies = list(triton.config.state_dir.glob("server-*"))  # the wheel's binaries, copied
    files = [p for p in root.rglob("*") if p.is_file() and not any(c in p.parents for c in server_copies)]
    assert any(p.name == "manifest.json" for p in files) and any(p.name == "release.json" for p in files)
    leaks = [str(p) for p in files if p != key_file and key in p.read_bytes()]
    assert not leaks, f"the control key was written into {leaks}"


@pytest.mark.slow
@pytest.mark.integration
def test_an_explicit_key_wins_and_the_logged_command_line_is_masked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    http, grpc, metrics = free_ports(3)
    cfg = TritonServerConfig(
        repository=tmp_path / "repo",
        state_dir=tmp_path / "state",
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        control_key=KEY,
    )
    with caplog.at_level(logging.DEBUG, logger="seqcls.localtriton"), LocalTriton(cfg) as server:
        assert not (cfg.repository / CONTROL_KEY_FILE).exists(), "an explicit key writes no key file"
        ops = [TritonOps(Endpoint(server.grpc_url, control_key=k)) for k in (KEY, WRONG, None)]
        try:
            ops[0].require_live()
            with pytest.raises(ControlRefused, match="the control key sent is wrong"):
                ops[1].require_live()
            with pytest.raises(ControlRefused, match="no control key is set"):
                ops[2].require_live()
        finally:
            for op in ops:
                op.client.close()
    command = [r.getMessage() for r in caplog.records if "tritonserver command" in r.getMessage()]
    assert command and "triton-control-key=***" in command[0]
    assert KEY not in caplog.text
    assert KEY not in (cfg.state_dir / "tritonserver.log").read_text()
