"""The direct pipeline (``SEQCLS_SERVING_PIPELINE=direct``): ``<m>`` as one python model running the three steps.

Rendering and its refusals without a server; then a real Triton: an ensemble release, the same
checkpoint released again as direct (a new version, gated by the smoke test like any other), served
answers equal to the ensemble's, the composing models untouched by its requests, one bad request
refused alone, a changed step file found by the integrity check, and a rollback to the ensemble.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from seqcls.config import ReleaseConfig, serving_spec
from seqcls.contract.names import CLASSIC, ModelName
from seqcls.errors import InputError, ServingError
from seqcls.serving.repository import ServingOptions, check_configs, render_config
from seqcls.settings import PROJECT_ROOT, Settings

SOURCE = PROJECT_ROOT / "model_repository"


def _configs(options: ServingOptions, version: int = 3) -> dict[str, str]:
    return {m: render_config(SOURCE, m, options, version=version, num_labels=5) for m in CLASSIC.models}


def test_pipeline_from_the_environment_renders_a_python_model_with_the_ensembles_io(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from seqcls.serving.repository import parse_config

    monkeypatch.setenv("SEQCLS_SERVING_PIPELINE", "direct")  # the spec's default, when the release sets none
    options = ServingOptions.from_spec(serving_spec(ReleaseConfig(), Settings.from_env()))
    assert options.pipeline == "direct"
    direct, classic = _configs(options), _configs(replace(options, pipeline="ensemble"))
    public = parse_config(direct[CLASSIC.ensemble])
    ensemble = parse_config(classic[CLASSIC.ensemble])
    assert public.backend == "python" and not public.platform and not public.ensemble_scheduling.step
    assert [(t.name, t.data_type, list(t.dims)) for t in public.input] == [
        (t.name, t.data_type, list(t.dims)) for t in ensemble.input
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in public.output] == [
        (t.name, t.data_type, list(t.dims)) for t in ensemble.output
    ]
    assert public.max_batch_size == ensemble.max_batch_size
    assert list(public.version_policy.specific.versions) == [3]
    for model in CLASSIC.composing:  # the steps are rendered exactly as for the ensemble
        assert direct[model] == classic[model]
    check_configs(direct, 3, CLASSIC, "direct")
    check_configs(classic, 3, CLASSIC, "ensemble")
    with pytest.raises(ServingError, match="the direct pipeline is a python model, not 'ensemble'"):
        check_configs(classic, 3, CLASSIC, "direct")
    with pytest.raises(ServingError, match="steps"):
        check_configs(direct, 3, CLASSIC, "ensemble")
    monkeypatch.delenv("SEQCLS_SERVING_PIPELINE")
    assert ServingOptions.from_spec(serving_spec(ReleaseConfig(), Settings.from_env())).pipeline == "ensemble"
    release_set = serving_spec(ReleaseConfig(pipeline="ensemble"), Settings.from_env(serving_pipeline="direct"))
    assert release_set.pipeline == "ensemble"  # the release's param wins over the environment's default


def test_direct_io_that_differs_from_its_steps_is_refused() -> None:
    configs = _configs(ServingOptions(pipeline="direct"))
    configs[CLASSIC.ensemble] = configs[CLASSIC.ensemble].replace('name: "probabilities"', 'name: "probs"')
    with pytest.raises(ServingError, match=r"outputs .* differ from its steps'"):
        check_configs(configs, 3, CLASSIC, "direct")


@pytest.mark.parametrize("bad", ["fused", "single", "1"])
def test_a_bad_pipeline_names_the_variable_and_the_choices(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("SEQCLS_SERVING_PIPELINE", bad)
    with pytest.raises(InputError, match=f"SEQCLS_SERVING_PIPELINE='{bad}': expected one of ensemble, direct"):
        Settings.from_env()


def test_direct_needs_the_python_runtime() -> None:
    with pytest.raises(InputError, match="needs runtime 'python-onnxruntime', not 'onnxruntime'"):
        ServingOptions(runtime="onnxruntime", pipeline="direct")
    with pytest.raises(InputError, match="serving option pipeline='both'"):
        ServingOptions(pipeline="both")


# ----------------------------------------------------------------------------- a real Triton


def _infer(client, texts: list, model: str = ModelName("seqcls"), version: str = ""):
    import tritonclient.grpc as grpcclient

    data = np.array([[t.encode("utf-8") if isinstance(t, str) else t] for t in texts], dtype=object)
    inp = grpcclient.InferInput("TEXT", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    result = client.infer(model, [inp], model_version=version)
    return result.as_numpy("predictions"), result.as_numpy("probabilities")


def _successes(client, model: str) -> int:
    return sum(s.inference_stats.success.count for s in client.get_inference_statistics(model).model_stats)


@pytest.mark.slow
@pytest.mark.integration
def test_direct_release_serves_the_ensembles_answers_in_one_model_and_rolls_back(
    server, tiny_checkpoint: Path, home: Path
) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from seqcls.ops.status import model_status
    from seqcls.ops.sync import sync
    from seqcls.release.intake import open_release
    from seqcls.serving.repository import Repository
    from seqcls.steps import run_release
    from seqcls.steps.rollback import rollback_model
    from tests.helpers.triton import settings_for

    settings = settings_for(server, home)
    first = {r.step: r for r in run_release(open_release(tiny_checkpoint, settings=settings))}
    assert first["publish"].summary["version"] == 1
    client = grpcclient.InferenceServerClient(url=server.config.grpc_url)
    expected = json.loads((Path(first["validate"].workspace) / "parity" / "expected.json").read_text())
    texts = [item["text"] for item in expected["items"]]
    classic = [_infer(client, [t]) for t in texts]

    direct = ReleaseConfig(pipeline="direct")  # the release's serving spec, not the worker's environment
    second = {r.step: r for r in run_release(open_release(tiny_checkpoint, direct, settings))}
    assert second["publish"].summary["version"] == 2 and not second["publish"].summary["reused"]
    assert second["smoke"].summary["texts"] == len(texts)  # the smoke gate ran through the direct model
    config = client.get_model_config("seqcls", "2").config
    assert config.backend == "python" and not config.platform
    ready = {
        m.name: m.version
        for m in client.get_model_repository_index(headers=server.control_headers()).models
        if m.state == "READY"
    }
    # v2's steps run inside seqcls: its composing models are not loaded (v1's stay warm for a rollback)
    assert ready == {"seqcls": "2", **dict.fromkeys(CLASSIC.composing, "1")}, ready
    status = model_status(settings, ModelName("seqcls"))
    assert "serving Triton v2" in status.lines()[0] and "through the direct pipeline" in status.lines()[0]
    assert "serving spec: fp32 · python-onnxruntime · direct · cpu 1x2 · metrics on" in status.lines()[1]
    assert status.agree, status.lines()

    composing_before = {m: _successes(client, m) for m in CLASSIC.composing}
    public_before = _successes(client, "seqcls")
    served = [_infer(client, [t]) for t in texts]
    for (p0, q0), (p1, q1) in zip(classic, served, strict=True):
        assert p0.tolist() == p1.tolist()
        np.testing.assert_array_equal(q0, q1)  # the same steps on the same graph: bit for bit
    batch_preds, _ = _infer(client, texts[:8])
    assert batch_preds.tolist() == [p.tolist()[0] for p, _ in served[:8]]
    with pytest.raises(InferenceServerException, match="tokenizer: text 0 is not valid UTF-8"):
        _infer(client, [b"\xff\xfe"])
    assert _infer(client, [texts[0]])[0].tolist() == served[0][0].tolist()  # still serving after the refusal
    assert {m: _successes(client, m) for m in CLASSIC.composing} == composing_before  # not through the ensemble
    assert _successes(client, "seqcls") >= public_before + len(texts) + 2

    repo = Repository.from_settings(settings, ModelName("seqcls"))
    info = json.loads((repo.root / "seqcls" / "2" / "release.json").read_text())
    assert {"model.py", "steps.json", "model/model.onnx", "tokenizer/vocab.txt", "postprocess/release.json"} <= set(
        info["files"]
    )
    assert info["serving"]["pipeline"] == "direct"
    assert info["spec"] == {
        "profile": "fp32",
        "runtime": "python-onnxruntime",
        "pipeline": "direct",
        "device": "cpu",
        "layout": None,
        "metrics": True,
    }
    assert not repo.damaged_files(2)
    step_file = repo.root / "seqcls" / "2" / "postprocess" / "release.json"
    original = step_file.read_bytes()
    step_file.unlink()  # a new file in place (not through a possible hard link): only this copy changes
    step_file.write_bytes(original + b" ")
    assert "seqcls/2/postprocess/release.json changed since publish" in repo.damaged_files(2)
    step_file.unlink()
    step_file.write_bytes(original)

    server.stop()  # a restarted Triton has nothing loaded: sync loads the direct version from its own directory
    server.start()
    client = grpcclient.InferenceServerClient(url=server.config.grpc_url)
    sync(settings, ["seqcls"])
    assert _infer(client, [texts[1]])[0].tolist() == served[1][0].tolist()
    assert model_status(settings, ModelName("seqcls")).agree

    rollback_model(settings, ModelName("seqcls"), reason="test: back to the ensemble")
    assert client.get_model_config("seqcls", "1").config.platform == "ensemble"
    assert [_infer(client, [t])[0].tolist() for t in texts] == [p.tolist() for p, _ in classic]
    after = model_status(settings, ModelName("seqcls"))
    assert "pipeline" not in after.lines()[0] and after.agree, after.lines()


@pytest.mark.slow
@pytest.mark.integration
def test_the_bench_compares_both_pipelines_of_one_version_on_one_server(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from seqcls_tools.bench import lone_cli
    from seqcls_tools.bench.lone import REMAINDER
    from seqcls_tools.bench.markdown import direct_section
    from tests.helpers.demo_models import quick_demo_model

    checkpoint = quick_demo_model(tmp_path_factory).path
    results = lone_cli.run(checkpoint, ["fp32"], 20, tmp_path / "work", clients=2, seconds=1.0)

    entry = results["configs"]["fp32"]["direct"]
    assert entry["model"] == "seqcls.direct" and entry["texts_compared"] == 240
    assert entry["differing"] == 0  # the same steps on the same graph answer alike
    for layout in ("ensemble", "direct"):
        lone, load = entry["layouts"][layout]["lone"], entry["layouts"][layout]["load"]
        assert lone["speed_vs_inprocess"] == pytest.approx(entry["inprocess"]["p50_ms"] / lone["p50_ms"], abs=1e-3)
        assert load["failed"] == 0 and load["sentences_per_s"] > 0
        limit = entry["inprocess"]["limit_sentences_per_s"]
        assert load["speed_vs_inprocess"] == pytest.approx(load["sentences_per_s"] / limit, rel=0.02)
    # the direct model's requests went through it alone: Triton counted them there, as one model
    parts = entry["layouts"]["direct"]["lone"]["parts"]
    assert [p["part"] for p in parts] == ["seqcls.direct", REMAINDER]
    # the floor: an empty python model with the same input, timed the same way, loaded and gone again
    floor = entry["floor"]
    assert [p["part"] for p in floor["parts"]] == ["seqcls.floor", REMAINDER]
    assert 0 < floor["p50_ms"] < entry["layouts"]["direct"]["lone"]["p50_ms"]  # the model's work is on top
    inproc = entry["inprocess"]["p50_ms"]
    assert floor["ceiling"]["python"] == pytest.approx(inproc / (inproc + floor["p50_ms"]), abs=1e-3)
    # perf_analyzer is installed by the test command (make setup-perf): its C++ client times each one too
    for lone in (floor, *(entry["layouts"][k]["lone"] for k in ("ensemble", "direct"))):
        assert lone["perf_analyzer_p50_ms"] > 0 and lone["perf_analyzer_inprocess_p50_ms"] > 0, lone
    for lone in (entry["layouts"][k]["lone"] for k in ("ensemble", "direct")):  # against in process right after it
        speed = lone["perf_analyzer_inprocess_p50_ms"] / lone["perf_analyzer_p50_ms"]
        assert lone["perf_analyzer_speed_vs_inprocess"] == pytest.approx(speed, abs=1e-3)
    assert 0 < floor["ceiling"]["perf_analyzer"] < 1
    lines = direct_section(results)
    assert lines[3].startswith("*Conditions:* CPU ")
    rows = [line.split(" | ") for line in lines if line.startswith("| fp32 |")]
    assert [r[1] for r in rows] == ["ensemble", "direct", f"{floor['p50_ms']:.2f}"]


def test_the_floor_model_keeps_the_direct_models_input_and_batching_and_answers_with_the_text() -> None:
    from seqcls_tools.bench.direct import floor_model

    direct = {
        "name": "m.direct",
        "backend": "python",
        "maxBatchSize": 64,
        "input": [{"name": "TEXT", "dataType": "TYPE_STRING", "dims": ["1"]}],
        "output": [{"name": "predictions", "dataType": "TYPE_STRING"}, {"name": "probabilities"}],
        "dynamicBatching": {"maxQueueDelayMicroseconds": "100"},
        "instanceGroup": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {"steps": {"stringValue": "x"}},
    }
    name, config, files = floor_model(json.dumps(direct), "m")
    floor = json.loads(config)
    assert name == floor["name"] == "m.floor"
    assert [o["name"] for o in floor["output"]] == ["predictions"]
    assert {k: floor[k] for k in ("input", "maxBatchSize", "dynamicBatching", "instanceGroup")} == {
        k: direct[k] for k in ("input", "maxBatchSize", "dynamicBatching", "instanceGroup")
    }
    assert "parameters" not in floor and list(files) == ["file:1/model.py"]
    source = files["file:1/model.py"].decode("utf-8")
    compile(source, "model.py", "exec")
    assert "'TEXT'" in source and "'predictions'" in source
    # the served ensemble's config as Triton returns it (field names as in the proto): one python instance
    ensemble = {"name": "m", "platform": "ensemble", "max_batch_size": 8, "input": direct["input"], "output": []}
    ensemble["ensemble_scheduling"] = {"step": [{"model_name": "m_model", "model_version": "-1"}]}
    floor = json.loads(floor_model(json.dumps(ensemble), "m")[1])
    assert floor["backend"] == "python" and "platform" not in floor and "ensembleScheduling" not in floor
    assert floor["maxBatchSize"] == 8 and floor["instanceGroup"] == [{"count": 1, "kind": "KIND_CPU"}]


@pytest.mark.parametrize("links", [True, False])
def test_the_steps_inside_a_direct_version_are_the_bytes_hashed_at_publish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, links: bool
) -> None:
    import hashlib
    import os

    from seqcls.steps import publish

    if not links:  # a volume without hard links: copied, hashed as written, checked

        def no_link(src: object, dst: object) -> None:
            raise OSError("hard links not supported here")

        monkeypatch.setattr(os, "link", no_link)
    configs = _configs(ServingOptions(pipeline="direct"), version=4)
    for model in CLASSIC.composing:
        vdir = tmp_path / model / "4"
        vdir.mkdir(parents=True)
        (vdir / "data.bin").write_bytes(model.encode() * 100)
        digest = hashlib.sha256((vdir / "data.bin").read_bytes()).hexdigest()
        (vdir / "release.json").write_text(json.dumps({"files": {"data.bin": digest}}))
    vdir = tmp_path / "seqcls" / "4"
    vdir.mkdir(parents=True)
    files = publish._direct_steps(tmp_path, vdir, 4, configs, CLASSIC)
    assert set(files) == {
        f"{step}/{name}" for step in ("tokenizer", "model", "postprocess") for name in ("data.bin", "release.json")
    } | {"steps.json"}
    for rel, digest in files.items():
        assert hashlib.sha256((vdir / rel).read_bytes()).hexdigest() == digest, rel
    steps = json.loads((vdir / "steps.json").read_text())
    assert steps["model"]["parameters"]["batching"]["string_value"] == "per-text"
    assert steps["tokenizer"]["name"] == "tokenizer" and set(steps) == {"tokenizer", "model", "postprocess"}
    assert (vdir / "model" / "data.bin").stat().st_nlink == (2 if links else 1)

    if not links:  # a composing file that no longer has the bytes hashed when it was written is never copied
        (tmp_path / "seqcls_model" / "4" / "data.bin").write_bytes(b"other bytes")
        again = tmp_path / "again"
        again.mkdir()
        with pytest.raises(ServingError, match="changed since it was hashed for this release"):
            publish._direct_steps(tmp_path, again, 4, configs, CLASSIC)


def test_preflight_refuses_the_direct_pipeline_on_the_native_runtime_before_export(
    tiny_checkpoint: Path, home: Path
) -> None:
    from seqcls.release.intake import open_release
    from seqcls.steps.preflight import preflight

    settings = Settings(home=home, runtime="onnxruntime", serving_pipeline="direct")
    with pytest.raises(InputError, match="pipeline 'direct' runs the ONNX model in its python step"):
        open_release(tiny_checkpoint, settings=settings)  # the spec cannot be made: refused before any copy
    assert not (home / "releases").exists() or not any((home / "releases").rglob("manifest.json"))
    with pytest.raises(InputError, match="pipeline 'direct' runs the ONNX model in its python step"):
        open_release(tiny_checkpoint, ReleaseConfig(pipeline="direct", runtime="onnxruntime"), Settings(home=home))
    ok = open_release(tiny_checkpoint, settings=replace(settings, serving_pipeline="ensemble"))
    assert all(c.ok for c in preflight(ok, servers=()).checks)
