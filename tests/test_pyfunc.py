"""The registered MLflow model predicts what Triton predicts (issue 14), and every gate leaves its
parity evidence on an MLflow run, passed or failed.

The model is loaded the way users load it (``mlflow.pyfunc.load_model("models:/<name>/<version>")``)
and served the way MLflow serves it (``mlflow models serve``, with ``seqcls`` made unimportable),
and its answers are compared with the decisions the parity gate validated (``parity/expected.json``:
what the smoke test holds the served ensemble to).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from seqcls.config import ReleaseConfig
from seqcls.contract import shipped
from seqcls.errors import GateError
from seqcls.registry import ledger as registry
from seqcls.registry.runs import log_parity_evidence
from seqcls.release.intake import open_release
from seqcls.release.keys import release_key
from seqcls.release.records import Expected, Registered, served_onnx
from seqcls.release.workspace import Release
from seqcls.settings import Settings
from seqcls.steps import run_release
from seqcls.steps.evaluate import evaluate
from seqcls.steps.register import register
from seqcls.steps.validate import validate

pytestmark = pytest.mark.slow

PROJECT_ROOT = Path(__file__).resolve().parents[1]
ARTIFACT = PROJECT_ROOT / "var" / "test-artifacts" / "pyfunc-serve.json"


def _registered(ckpt: Path, **config) -> tuple[Release, Registered]:
    release = open_release(ckpt, ReleaseConfig(**config))
    run_release(release, until="register")
    return release, Registered.load(release.workspace)


def _assert_answers(rows: list[dict], expected: Expected, items=None) -> None:
    """Labels exactly, confidences and probabilities within the expected's ``prob_atol``."""
    items = expected.items if items is None else items
    assert len(rows) == len(items)
    for row, item in zip(rows, items, strict=True):
        assert list(row["labels"]) == item.labels, item.text
        np.testing.assert_allclose(row["confidences"], item.confidences, atol=expected.prob_atol, err_msg=item.text)
        np.testing.assert_allclose(row["probabilities"], item.probabilities, atol=expected.prob_atol, err_msg=item.text)


def test_registered_model_predicts_the_validated_decisions(tiny_checkpoint: Path) -> None:
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    # a per-label threshold the parent misses while its child passes: the hierarchy adds the parent
    release, reg = _registered(tiny_checkpoint, threshold=0.3, thresholds={"财经": 0.9})
    expected = Expected.load(release.workspace)
    texts = [item.text for item in expected.items]
    implied = [i for i in expected.items if "财经" in i.labels and i.probabilities[expected.labels.index("财经")] < 0.9]
    assert implied, "no golden text exercises the hierarchy"

    t0 = time.perf_counter()
    model = mlflow.pyfunc.load_model(f"models:/seqcls/{reg.version}")
    load_seconds = time.perf_counter() - t0
    out = model.predict(texts)
    assert list(out.columns) == ["labels", "confidences", "probabilities"]
    _assert_answers(out.to_dict("records"), expected)
    # every accepted input form gives the same answers; each text alone, whatever else is in the call
    frame = model.predict(pd.DataFrame({"text": texts[:5]})).to_dict("records")
    _assert_answers(frame, expected, expected.items[:5])
    _assert_answers(model.predict(np.array(texts[5:9])).to_dict("records"), expected, expected.items[5:9])
    _assert_answers(model.predict(texts[9]).to_dict("records"), expected, expected.items[9:10])
    with pytest.raises(MlflowException, match=r"text 1 is 70000 bytes, over the limit .*max_text_bytes"):
        model.predict(["ok", "a" * 70000])

    candidate = mlflow.pyfunc.load_model("models:/seqcls@candidate")
    _assert_answers(candidate.predict(texts[:3]).to_dict("records"), expected, expected.items[:3])
    meta = model.metadata
    assert meta.metadata["labels"] == expected.labels and meta.metadata["release_key"] == reg.release_key
    assert [c["name"] for c in meta.signature.outputs.to_dict()] == ["labels", "confidences", "probabilities"]
    assert meta.signature.inputs.to_dict() == [{"type": "string", "required": True}]
    assert meta.saved_input_example_info["type"] == "dataframe"

    local = Path(mlflow.artifacts.download_artifacts(f"models:/seqcls/{reg.version}"))
    common = PROJECT_ROOT / "model_repository" / "common"
    for name in ("seqcls_text.py", "seqcls_decide.py", "seqcls_contract.py"):  # the very files Triton runs
        assert (local / "code" / name).read_bytes() == (common / name).read_bytes(), name
    served = served_onnx(release.workspace)
    assert _sha(local / "artifacts" / served.name) == _sha(served)
    shipped_release = json.loads((local / "artifacts" / "release.json").read_text(encoding="utf-8"))
    text = shipped.text()  # the tokenizer's character classes ride along, valid for this interpreter
    assert text.read_char_classes(local / "artifacts" / text.CHAR_CLASSES_FILE) == text.paddlenlp_char_classes()
    assert shipped_release["labels"] == expected.labels and shipped_release["thresholds"] == expected.thresholds
    assert shipped_release["release_key"] == reg.release_key and shipped_release["max_length"] == 128
    assert shipped_release["max_text_bytes"] == 64 * 1024  # the limit Triton's tokenizer enforces
    requirements = (local / "requirements.txt").read_text().split()
    import onnxruntime
    import tokenizers

    for pin in (
        f"onnxruntime=={onnxruntime.__version__}",
        f"numpy=={np.__version__}",
        f"tokenizers=={tokenizers.__version__}",
    ):
        assert pin in requirements
    assert "seqcls" not in " ".join(requirements)
    assert load_seconds < 60


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _post(url: str, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.mark.integration
def test_mlflow_models_serve_answers_the_same(tiny_checkpoint: Path, tmp_path: Path) -> None:
    from seqcls.localtriton import free_port

    release, reg = _registered(tiny_checkpoint)
    expected = Expected.load(release.workspace)
    shadow = tmp_path / "no-seqcls" / "seqcls"  # the server must not need the seqcls package
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('the MLflow model must not import seqcls')\n")
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": registry.tracking_uri(release.settings),
        "PYTHONPATH": str(shadow.parent),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    port = free_port()
    log_path = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/seqcls/{reg.version}"]
    cmd += ["--env-manager", "local", "-p", str(port), "-h", "127.0.0.1"]
    with open(log_path, "wb") as log_file:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            started = _wait_for_ping(f"http://127.0.0.1:{port}/ping", proc, log_path, t0)
            url = f"http://127.0.0.1:{port}/invocations"
            items = expected.items[:6]
            status, body = _post(url, {"inputs": [item.text for item in items[:4]]})
            assert status == 200, body
            _assert_answers(body["predictions"], expected, items[:4])
            split = {"columns": ["text"], "data": [[item.text] for item in items[4:]]}
            status, body = _post(url, {"dataframe_split": split})
            assert status == 200, body
            _assert_answers(body["predictions"], expected, items[4:])
            status, body = _post(url, {"inputs": ["a" * 70000]})
            assert status == 400 and "max_text_bytes" in body["message"]
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(json.dumps({"mlflow_models_serve_ready_seconds": round(started, 2)}, indent=1) + "\n")


def _wait_for_ping(url: str, proc: subprocess.Popen, log_path: Path, t0: float, timeout: float = 180) -> float:
    """Seconds from the ``mlflow models serve`` command to its first 200 on /ping."""
    while time.perf_counter() - t0 < timeout:
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return time.perf_counter() - t0
        except OSError:
            time.sleep(0.2)
        assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
    pytest.fail(f"mlflow models serve did not answer /ping in {timeout:.0f}s: {log_path.read_text()[-3000:]}")


# ----------------------------------------------------------------------------- parity evidence


def _validate_with_evidence(release: Release):
    """validate as the call site proposed for ``steps/validate.validate`` (issue 14) runs it."""
    try:
        result = validate(release)
    except GateError:
        if not (release.workspace.step("validate") or {}).get("mlflow_run_id"):  # once validate calls it itself
            log_parity_evidence(release, "failed")
        raise
    if result.status == "ok" and not (release.workspace.step("validate") or {}).get("mlflow_run_id"):
        log_parity_evidence(release, "passed")
    return result


def _artifact_names(c, run_id: str, path: str) -> set[str]:
    return {Path(a.path).name for a in c.list_artifacts(run_id, path)}


def test_parity_evidence_for_a_passed_gate_is_on_the_registered_run(tiny_checkpoint: Path) -> None:
    release = open_release(tiny_checkpoint)
    run_release(release, until="convert")
    assert _validate_with_evidence(release).status == "ok"
    run_id = release.workspace.step("validate")["mlflow_run_id"]
    c = registry.client(release.settings)
    run = c.get_run(run_id)
    assert run.data.tags["seqcls.gates.parity"] == "passed" and run.data.tags["seqcls.outcome"] == "validated"
    assert run.data.tags["release_key"] == release_key(release)
    assert run.data.metrics["decisions.agreement"] == 1.0 and run.data.params["atol"] == str(release.config.atol)
    assert {"report.json", "plot.png", "expected.json"} <= _artifact_names(c, run_id, "parity")

    assert evaluate(release).summary["passed"]  # no eval set: the quality gate says it skipped, on the same run
    assert c.get_run(run_id).data.tags["seqcls.gates"] == "skipped"
    reg = register(release).summary  # register adopts the run: evidence, model and version on one run
    assert reg["run_id"] == run_id
    run = c.get_run(run_id)
    assert run.data.tags["seqcls.outcome"] == "registered" and run.info.status == "FINISHED"
    assert c.get_model_version("seqcls", str(reg["version"])).run_id == run_id
    assert register(release).summary["version"] == reg["version"]  # still idempotent
    assert len(c.search_runs([run.info.experiment_id])) == 1

    stricter = open_release(tiny_checkpoint, ReleaseConfig(atol=5e-5))  # gate-only: the same serving configuration
    assert _validate_with_evidence(stricter).status == "ok"  # the gate ran again: a second evidence run
    evaluate(stricter)
    again = register(stricter).summary
    assert again["version"] == reg["version"] and not again["created"]
    second = c.get_run(stricter.workspace.step("validate")["mlflow_run_id"])
    assert second.info.run_id != run_id and second.data.tags["seqcls.outcome"] == "reused"
    assert second.data.tags["seqcls.registered_version"] == str(reg["version"])


def test_parity_evidence_for_a_failed_gate(tiny_checkpoint: Path) -> None:
    vocab = (tiny_checkpoint / "vocab.txt").read_text(encoding="utf-8").splitlines()
    vocab[vocab.index("公")] = "公 "  # PaddleNLP keeps the space, the serving tokenizer does not
    (tiny_checkpoint / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    release = open_release(tiny_checkpoint)
    run_release(release, until="convert")
    with pytest.raises(GateError, match="tokenizer ids differ"):
        _validate_with_evidence(release)
    record = release.workspace.step("validate")
    assert record["status"] == "failed"
    c = registry.client(release.settings)
    run = c.get_run(record["mlflow_run_id"])
    assert run.data.tags["seqcls.gates.parity"] == "failed" and run.data.tags["seqcls.outcome"] == "gate_failed"
    assert run.info.status == "FAILED" and "Parity gate failed" in run.data.tags["seqcls.gate_error"]
    assert run.data.metrics["tokenizer.mismatched"] > 0
    assert {"report.json", "plot.png"} == _artifact_names(c, run.info.run_id, "parity")
    assert c.search_registered_models() == []  # evidence, not a registration


def test_parity_evidence_never_raises(tiny_checkpoint: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from seqcls.localtriton import free_port

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    settings = Settings(home=home, mlflow_tracking_uri=f"http://127.0.0.1:{free_port()}")  # nothing listens
    release = open_release(tiny_checkpoint, settings=settings)
    assert log_parity_evidence(release, "failed") is None  # a warning; the gate's own error stays the error
    with pytest.raises(ValueError, match="outcome"):
        log_parity_evidence(release, "maybe")
