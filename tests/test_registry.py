"""MLflow registry: idempotent registration with lineage, promote/undo, real tracking server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from seqcls import registry
from seqcls.errors import GateError
from seqcls.settings import Settings
from seqcls.steps import run_release
from seqcls.steps.promote import promote
from seqcls.steps.register import register
from seqcls.workspace import Release, open_release

pytestmark = pytest.mark.slow


def _validated(ckpt: Path, settings: Settings | None = None) -> Release:
    release = open_release(ckpt, settings=settings)
    run_release(release, until="validate")
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
    import mlflow.onnx
    import onnxruntime as ort

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

    # models:/seqcls@candidate is the ONNX flavor: same logits as the workspace's ONNX file
    model = mlflow.onnx.load_model("models:/seqcls@candidate")
    ids = np.array([[1, 40, 41, 42, 2]], dtype=np.int64)
    feeds = {"input_ids": ids, "token_type_ids": np.zeros_like(ids)}
    served = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    ws_onnx = Path(second.workspace) / "onnx" / "model.onnx"
    local = ort.InferenceSession(str(ws_onnx), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(served, local, atol=1e-6)


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
    import mlflow.onnx

    settings = Settings(home=home, mlflow_tracking_uri=mlflow_server)
    release = _validated(tiny_checkpoint, settings)
    result = register(release)
    assert result.summary["version"] == 1
    assert register(release).summary["created"] is False
    _fake_served(release, 1)
    promoted = promote(release)
    assert promoted.summary["url"] == f"{mlflow_server}/#/models/seqcls/versions/1"
    assert registry.champion_fingerprint(settings, "seqcls") == release.checkpoint.fingerprint
    mlflow.set_tracking_uri(mlflow_server)
    assert mlflow.onnx.load_model("models:/seqcls@champion").graph.output[0].name == "logits"
    assert not list((home / "mlflow").glob("*.db"))  # nothing fell back to the local store
