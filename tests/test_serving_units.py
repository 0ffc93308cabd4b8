"""Fast tests of the serving source: config rendering (all runtimes/devices), shipped logic."""

from __future__ import annotations

import numpy as np
import pytest

from seqcls.errors import InputError, ServingError
from seqcls.serving import shipped
from seqcls.serving.names import ENSEMBLE, MODEL, MODELS
from seqcls.serving.repository import (
    Repository,
    ServingOptions,
    check_configs,
    parse_config,
    render_config,
)
from seqcls.settings import PROJECT_ROOT

SOURCE = PROJECT_ROOT / "model_repository"


def _render_all(options: ServingOptions, version: int = 3, labels: int = 7) -> dict[str, str]:
    return {m: render_config(SOURCE, m, options, version=version, num_labels=labels) for m in MODELS}


@pytest.mark.parametrize(
    "options",
    [
        ServingOptions(),
        ServingOptions.for_device("cpu", "onnxruntime"),
        ServingOptions.for_device("gpu"),
        ServingOptions.for_device("gpu", gpu_accelerator="tensorrt-fp16", model_instances=2),
        ServingOptions(dynamic_batching=False, batching="per-request", graph_optimization_level="basic"),
        ServingOptions(padding="buckets", batching="group-by-length", buckets=(8, 16, 32)),
    ],
    ids=["cpu-python-ort", "cpu-native-ort", "gpu", "gpu-trt-fp16", "classic-like", "cpu-buckets"],
)
def test_every_profile_renders_and_parses(options: ServingOptions) -> None:
    configs = _render_all(options)
    check_configs(configs, 3)
    model = parse_config(configs[MODEL])
    assert model.max_batch_size == options.max_batch_size
    assert list(model.version_policy.specific.versions) == [3]
    assert model.HasField("dynamic_batching") == options.dynamic_batching
    if options.runtime == "onnxruntime":
        assert model.backend == "onnxruntime" and list(model.output[0].dims) == [7]
        assert model.instance_group[0].kind == (2 if options.device == "cpu" else 1)  # KIND_CPU=2, KIND_GPU=1
    else:
        params = {k: v.string_value for k, v in model.parameters.items()}
        assert model.backend == "python" and params["batching"] == options.batching
    if options.gpu_accelerator == "tensorrt-fp16":
        acc = model.optimization.execution_accelerators.gpu_execution_accelerator[0]
        assert acc.name == "tensorrt" and acc.parameters["precision_mode"] == "FP16"
    ens = parse_config(configs[ENSEMBLE])
    assert [s.model_version for s in ens.ensemble_scheduling.step] == [3, 3, 3]


def test_bad_options_and_configs_are_rejected() -> None:
    with pytest.raises(InputError, match="padding='pad-everything'"):
        ServingOptions(padding="pad-everything")
    with pytest.raises(InputError, match="GPU needs runtime 'onnxruntime'"):
        ServingOptions(device="gpu", runtime="python-onnxruntime")
    with pytest.raises(ServingError, match="not a valid Triton model config"):
        parse_config('name: "x"\nmax_batch_size: lots\n')
    configs = _render_all(ServingOptions())
    configs[ENSEMBLE] = configs[ENSEMBLE].replace(
        'model_version: 3\n      input_map { key: "input_ids"', 'model_version: 2\n      input_map { key: "input_ids"'
    )
    with pytest.raises(ServingError, match="pins version 2, not 3"):
        check_configs(configs, 3)


def test_config_for_rewrites_only_the_policy(tmp_path) -> None:
    repo = Repository(tmp_path, SOURCE)
    text = render_config(SOURCE, MODEL, ServingOptions(), version=4, num_labels=7)
    (tmp_path / MODEL / "4").mkdir(parents=True)
    (tmp_path / MODEL / "4" / "config.snapshot.pbtxt").write_text(text)
    live = repo.config_for(MODEL, 4, [3, 4])
    assert list(parse_config(live).version_policy.specific.versions) == [3, 4]
    assert live.replace("[ 3, 4 ]", "[ 4 ]") == text
    repo.write_config(MODEL, live)
    assert repo.live_versions(MODEL) == [3, 4]


def test_padding_strategies() -> None:
    text = shipped.text()
    ids = [[1, 5, 2], [1, 5, 6, 7, 8, 2]]
    a, t = text.pad(ids, strategy="longest")
    assert a.shape == (2, 6) and a.dtype == np.int64 and not t.any() and a[0, 3:].tolist() == [0, 0, 0]
    assert text.pad(ids, strategy="buckets", buckets=(4, 8, 16))[0].shape == (2, 8)
    assert text.pad(ids, strategy="max_length", max_length=32)[0].shape == (2, 32)
    assert text.padded_length([130], strategy="buckets", max_length=128) == 130  # never below the longest
    assert text.padded_length([100], strategy="buckets", max_length=128, buckets=(64, 256)) == 128


def test_decode_utf8_errors_per_item() -> None:
    texts, errors = shipped.text().decode_utf8([b"ok", b"\xff\xfe", "str", b""])
    assert texts == ["ok", "", "str", ""]
    assert errors[0] is None and "not valid UTF-8" in errors[1] and errors[2] is None and errors[3] is None


def test_decide_thresholds_and_hierarchy() -> None:
    d = shipped.decide()
    labels = ["体育", "体育##夺冠", "财经", "财经##融资"]
    th = d.threshold_vector(labels, 0.5, {"财经##融资": 0.9})
    probs = np.array([[0.2, 0.8, 0.1, 0.1], [0.1, 0.1, 0.7, 0.85], [0.6, 0.1, 0.1, 0.95]], dtype=np.float32)
    rows = d.decide(probs, th, labels)
    assert rows[0] == [("体育", pytest.approx(0.8)), ("体育##夺冠", pytest.approx(0.8))]  # parent implied
    assert [lbl for lbl, _ in rows[1]] == ["财经"]  # 0.85 < per-label 0.9
    assert [lbl for lbl, _ in rows[2]] == ["体育", "财经", "财经##融资"]
    assert [lbl for lbl, _ in d.decide(probs, th, labels, hierarchy=False)[0]] == ["体育##夺冠"]
    assert d.parse_thresholds('{"default": 0.4, "体育": 0.7}', labels).tolist() == pytest.approx([0.7, 0.4, 0.4, 0.4])
    with pytest.raises(ValueError, match="unknown labels: nope"):
        d.threshold_vector(labels, 0.5, {"nope": 0.3})
    assert d.near_threshold(np.array([[0.5004, 0.1]]), np.array([0.5, 0.5]), 1e-3).tolist() == [True]
    assert d.sigmoid(np.array([-1000.0, 0.0, 1000.0])).tolist() == [0.0, 0.5, 1.0]
