"""Profile ``bf16``: fp32's graph run by OpenVINO at bf16, on CPUs with AVX512-BF16 or AMX.

Refusals without such a CPU, on Triton's native backend and without OpenVINO (named, before any
export); then, where this CPU has bf16 arithmetic, the real thing: convert checks the engine, the
parity gate judges decision agreement, a real Triton serves ``model.onnx`` through OpenVINO in
``seqcls_model`` (answers equal to the gates' in-process engine, and not fp32's: the precision
really is bf16), the quality gate scores it against fp32.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import seqcls_engine

from seqcls.config import ReleaseConfig
from seqcls.contract.names import ModelName
from seqcls.errors import ConversionError, InputError
from seqcls.localtriton import LocalTriton
from seqcls.release.intake import open_release
from seqcls.settings import Settings
from seqcls.spec import host_refusal
from tests.helpers.demo_models import quick_demo_model
from tests.helpers.drills import Drill
from tests.helpers.triton import settings_for

DEMO_TEST = Path(__file__).resolve().parents[1] / "tools" / "seqcls_tools" / "demo" / "data" / "test.jsonl"

HAS_BF16 = bool(set(seqcls_engine.cpu_flags()) & set(seqcls_engine.BF16_CPU_FLAGS))
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has neither avx512_bf16 nor amx_bf16")
TEXTS = ["公司宣布裁员", "球队决赛夺冠", "油价大幅上涨", "新品正式发布", "央行下调利率，市场反应平稳"]


def _client(server: LocalTriton):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(url=server.config.grpc_url)


def test_a_cpu_without_bf16_is_refused_naming_the_flags_and_the_alternatives() -> None:
    msg = host_refusal("bf16", providers=("CPUExecutionProvider",), cpu_flags=frozenset({"avx2", "avx512f"}))
    assert msg and "avx512_bf16" in msg and "amx_bf16" in msg and "int8 or fp32-fused" in msg
    assert host_refusal("bf16", providers=("CPUExecutionProvider",), cpu_flags=frozenset({"amx_bf16"})) is None
    assert host_refusal("bf16", device="cpu", runtime="python-onnxruntime") is None  # serving side: no CPU read
    native = host_refusal("bf16", runtime="onnxruntime")
    assert native and "runtime python-onnxruntime" in native and "SEQCLS_RUNTIME" in native
    assert host_refusal("int8", providers=("CPUExecutionProvider",), cpu_flags=frozenset()) is None


def test_cpu_flags_are_read_from_the_flags_line(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\nbugs\t: x\n", encoding="utf-8")
    assert seqcls_engine.cpu_flags(str(info)) == {"fpu", "avx2", "avx512_bf16"}
    assert seqcls_engine.cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_convert_refuses_bf16_on_a_cpu_without_it(tiny_checkpoint: Path, home: Path) -> None:
    from seqcls.profiles.optimize import check_engine

    with pytest.raises(ConversionError, match="needs a CPU with amx_bf16 or avx512_bf16"):
        check_engine(tiny_checkpoint / "missing.onnx", "bf16", cpu_flags=frozenset({"avx2"}))


def test_preflight_refuses_bf16_before_export(
    tiny_checkpoint: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seqcls.steps.preflight import preflight

    monkeypatch.setattr(seqcls_engine, "cpu_flags", lambda *a: frozenset({"avx2"}))
    release = open_release(tiny_checkpoint, ReleaseConfig(profile="bf16"), Settings(home=home))
    with pytest.raises(InputError, match="needs a CPU with"):
        preflight(release, servers=())
    assert not release.workspace.read()["steps"]
    native = open_release(tiny_checkpoint, ReleaseConfig(profile="bf16"), Settings(home=home, runtime="onnxruntime"))
    monkeypatch.setattr(seqcls_engine, "cpu_flags", lambda *a: frozenset({"amx_bf16"}))
    with pytest.raises(InputError, match="native ONNX Runtime backend has no bf16 path"):
        preflight(native, servers=())


@pytest.mark.slow
@pytest.mark.integration
@needs_bf16
def test_bf16_release_serves_openvino_bf16_answers_through_triton(
    server: LocalTriton, tiny_checkpoint: Path, home: Path
) -> None:
    from seqcls.contract import runtime, shipped
    from seqcls.serving.repository import Repository
    from seqcls.steps import run_release
    from seqcls.steps.smoke import infer
    from seqcls.steps.validate import serving_ids

    settings = settings_for(server, home)
    release = open_release(tiny_checkpoint, ReleaseConfig(profile="bf16"), settings)
    results = {r.step: r for r in run_release(release)}
    assert results["promote"].status == "ok"
    convert = release.workspace.read()["steps"]["convert"]["summary"]
    assert convert["optimize"]["engine"] == "openvino" and convert["optimize"]["precision"] == "bf16"
    assert "served_file" not in convert  # bf16 serves fp32's model.onnx
    expected = json.loads(release.workspace.path("parity/expected.json").read_text())
    assert expected["gate"] == "agreement"
    parity = json.loads(release.workspace.path("parity/report.json").read_text())
    assert parity["provider"].startswith("OpenVINO CPU (bf16)")
    served = Repository.from_settings(settings, ModelName("seqcls")).root / "seqcls_model" / "1"
    assert (served / "seqcls_engine.py").read_bytes() == Path(seqcls_engine.__file__).read_bytes()
    assert (served / "model.onnx").read_bytes() == release.workspace.path("onnx/model.onnx").read_bytes()

    _, probs = infer(_client(server), TEXTS)
    ids = serving_ids(release, TEXTS)
    sig = shipped.decide().sigmoid
    onnx_file = release.workspace.path("onnx/model.onnx")
    bf16 = runtime.session(onnx_file, ["CPUExecutionProvider"], profile="bf16")
    fp32 = runtime.ort_session(onnx_file, ["CPUExecutionProvider"])
    in_bf16 = np.concatenate([sig(runtime.ort_logits(bf16, [x])) for x in ids])
    in_fp32 = np.concatenate([sig(runtime.ort_logits(fp32, [x])) for x in ids])
    assert np.abs(probs - in_bf16).max() <= 1e-5, "Triton's bf16 answers are not the gates' engine's"
    assert np.abs(probs - in_fp32).max() > 1e-5, "served answers equal fp32's: bf16 was not used"
    # texts of one request are answered as each alone (as validated)
    client = _client(server)
    alone = np.concatenate([infer(client, [t])[1] for t in TEXTS])
    assert np.array_equal(probs, alone)
    # the gate's batch-invariance criterion (bucket shapes, whether or not this host batches), and how it serves
    invariance = parity["batch_invariance"]
    assert invariance["passed"] and invariance["rows_compared"] > 0 and invariance["rows_differing"] == 0
    wanted, why = seqcls_engine.batching_wanted()
    assert invariance["serving"] == ("batched" if wanted else "alone") and invariance["why"] == why
    assert f"seqcls_model: bf16 batching {'on: {' if wanted else 'off: ' + str(why)}" in server.log_path.read_text(
        errors="replace"
    )
    _concurrent_answers_equal_alone(server)


def _concurrent_answers_equal_alone(server: LocalTriton) -> None:
    """8 concurrent clients (Triton's dynamic batcher merges their requests) get each text's answer alone."""
    from seqcls.steps.smoke import infer

    texts = [*TEXTS, *(t + t[::-1] for t in TEXTS), *(t * 3 for t in TEXTS)]
    client = _client(server)
    alone = {t: infer(client, [t])[1] for t in texts}
    answers: dict[int, list[tuple[str, np.ndarray]]] = {}

    def ask(k: int) -> None:
        mine = _client(server)
        answers[k] = [(t, infer(mine, [t])[1]) for _ in range(3) for t in texts[k::8] + texts[: k + 1]]

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(ask, range(8)))
    got = [(t, p) for rows in answers.values() for t, p in rows]
    assert len(got) > 8 * 3
    assert [t for t, p in got if not np.array_equal(p, alone[t])] == [], "a text's answer moved with its batch-mates"


@pytest.mark.slow
@pytest.mark.integration
@needs_bf16
def test_bf16_batched_through_triton_answers_each_text_as_alone(
    tiny_checkpoint: Path, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batching forced on (``SEQCLS_BF16_BATCHING=on``, for the gates here and the Triton it starts): the gate
    records bucket-shape invariance and ``batched``; Triton's answers are the in-process engine's in bucket
    shapes, bit for bit, and under 8 concurrent clients each text's is its answer alone."""
    from seqcls.contract import runtime, shipped
    from seqcls.steps import run_release
    from seqcls.steps.smoke import infer
    from seqcls.steps.validate import serving_ids
    from tests.helpers.triton import start_triton

    monkeypatch.setenv(seqcls_engine.BATCHING_ENV, "on")
    server = start_triton(tmp_path, environment={seqcls_engine.BATCHING_ENV: "on"})
    try:
        release = open_release(tiny_checkpoint, ReleaseConfig(profile="bf16"), settings_for(server, home))
        assert {r.step: r for r in run_release(release)}["promote"].status == "ok"
        invariance = json.loads(release.workspace.path("parity/report.json").read_text())["batch_invariance"]
        assert invariance["passed"] and invariance["serving"] == "batched" and invariance["why"] is None
        assert invariance["engine_self_check"]["passed"]
        session = runtime.session(release.workspace.path("onnx/model.onnx"), ["CPUExecutionProvider"], profile="bf16")
        assert session.batching and session.buckets
        ids = serving_ids(release, TEXTS)
        in_process = shipped.decide().sigmoid(np.concatenate([runtime.ort_logits(session, [x]) for x in ids]))
        _, probs = infer(_client(server), TEXTS)
        assert np.abs(probs - in_process).max() <= 1e-6, "Triton's batched bf16 answers are not the engine's"
        assert "seqcls_model: bf16 batching on: {" in server.log_path.read_text(errors="replace")
        _concurrent_answers_equal_alone(server)
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.integration
@needs_bf16
def test_bf16_on_the_trained_demo_model_keeps_fp32s_labeled_f1(
    drill: Drill, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The quality gate scores bf16 against fp32 on the demo's labeled test split (the issue's bar: Δ
    micro-F1 ≤ 0.002), with the same code that would refuse it."""
    demo = quick_demo_model(tmp_path_factory).path
    out = drill.cli(
        "evaluate", "--checkpoint", str(demo), "--eval-set", str(DEMO_TEST), "--profile", "bf16",
        "--max-profile-f1-drop", "0.002", "--json",
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stderr[-2000:]
    data = json.loads(out.stdout)
    assert data["profile"] == "bf16" and data["fp32"] is not None
    checks = [c for c in data["checks"] if c["rule"] == "max_profile_f1_drop"]
    assert {c["metric"] for c in checks} == {"micro_f1", "macro_f1"}
    drop = data["fp32"]["micro_f1"] - data["candidate"]["micro_f1"]
    assert drop <= 0.002 and all(c["passed"] for c in checks), (drop, data["failures"])
    assert "OpenVINO" in out.stderr or "bf16" in out.stderr


@pytest.mark.slow
@needs_bf16
def test_registered_bf16_model_runs_openvino_in_the_mlflow_pyfunc(tiny_checkpoint: Path, home: Path) -> None:
    import mlflow.pyfunc

    from seqcls.release.records import Expected, Registered
    from seqcls.steps import run_release

    release = open_release(tiny_checkpoint, ReleaseConfig(profile="bf16"), Settings.from_env())
    for _ in run_release(release, until="register"):
        pass
    reg, expected = Registered.load(release.workspace), Expected.load(release.workspace)
    model = mlflow.pyfunc.load_model(f"models:/seqcls/{reg.version}")
    assert model.unwrap_python_model().session.get_providers() == ["OpenVINO CPU (bf16)"]
    rows = model.predict([item.text for item in expected.items]).to_dict("records")
    for row, item in zip(rows, expected.items, strict=True):  # the validated (served) bf16 answers
        assert list(row["labels"]) == item.labels, item.text
        np.testing.assert_allclose(row["probabilities"], item.probabilities, atol=1e-5, err_msg=item.text)
