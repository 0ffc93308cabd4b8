"""The host's serving layout (``SEQCLS_SERVING_LAYOUT``): instances × threads of the ONNX model, set explicitly."""

from __future__ import annotations

import json

import pytest

from seqcls.config import ReleaseConfig, serving_spec
from seqcls.errors import InputError
from seqcls.serving.repository import ServingOptions, render_config
from seqcls.settings import PROJECT_ROOT, Settings


def test_layout_from_the_environment_reaches_the_rendered_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQCLS_SERVING_LAYOUT", "2x1")  # the spec's default, when the release sets none
    options = _options()
    assert (options.model_instances, options.intra_op_threads) == (2, 1)
    text = render_config(PROJECT_ROOT / "model_repository", "seqcls_model", options, version=1, num_labels=7)
    assert "count: 2 kind: KIND_CPU" in text and 'key: "intra_op_threads" value: { string_value: "1" }' in text
    assert (_options(layout="1x2").model_instances, _options(layout="1x2").intra_op_threads) == (1, 2)  # param wins
    monkeypatch.delenv("SEQCLS_SERVING_LAYOUT")
    default = _options()
    assert (default.model_instances, default.intra_op_threads) == (1, 2)
    # an explicit override (the bench's variants) still wins over the release's layout
    monkeypatch.setenv("SEQCLS_SERVING_LAYOUT", "2x1")
    assert (
        ServingOptions.from_spec(serving_spec(ReleaseConfig(), Settings.from_env()), model_instances=3).model_instances
        == 3
    )


def _options(**params: str) -> ServingOptions:
    return ServingOptions.from_spec(serving_spec(ReleaseConfig(**params), Settings.from_env()))


@pytest.mark.parametrize("bad", ["2", "2x", "x1", "0x2", "2x0", "two x one", "2x1x1", "100x1"])
def test_a_bad_layout_param_names_the_param(bad: str) -> None:
    with pytest.raises(InputError, match="layout"):
        ReleaseConfig.from_dict({"layout": bad})


@pytest.mark.parametrize("bad", ["2", "2x", "x1", "0x2", "2x0", "two x one", "2x1x1", "100x1"])
def test_a_bad_layout_names_the_variable(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("SEQCLS_SERVING_LAYOUT", bad)
    with pytest.raises(InputError, match="SEQCLS_SERVING_LAYOUT="):
        Settings.from_env()


def test_candidate_layouts_are_every_split_of_the_cores() -> None:
    from seqcls.serving.layout import candidate_layouts

    assert candidate_layouts(1) == ["1x1"]
    assert candidate_layouts(2) == ["1x2", "2x1"]
    assert candidate_layouts(6) == ["1x6", "2x3", "3x2", "6x1"]
    with pytest.raises(InputError, match="cores"):
        candidate_layouts(0)


def _trial(layout: str, rate: float, p95: float, failed: int = 0):
    from seqcls.serving.layout import LayoutTrial

    return LayoutTrial(layout, rate, p95, requests=100, failed=failed, load_seconds=0.1)


def test_the_choice_is_the_fastest_layout_that_does_not_cost_a_lone_request_its_latency() -> None:
    from seqcls.errors import ServingError
    from seqcls.serving.layout import choose

    # the 2-core figures: 2x1 ~5 % more throughput, 1.65x the p95 of a lone request
    pick, why = choose([_trial("1x2", 49.4, 28.0), _trial("2x1", 52.0, 50.5)])
    assert pick.layout == "1x2" and "2x1 is 1.05× faster" in why
    pick, _ = choose([_trial("1x2", 49.4, 28.0), _trial("2x1", 52.0, 30.0)])
    assert pick.layout == "2x1"  # within the slack: throughput decides
    pick, _ = choose([_trial("1x2", 49.4, 28.0), _trial("2x1", 80.0, 20.0, failed=3)])
    assert pick.layout == "1x2"  # a layout that failed requests is never chosen
    with pytest.raises(ServingError, match="failed requests"):
        choose([_trial("1x2", 1.0, 1.0, failed=1)])


def test_a_trial_config_is_the_version_s_own_renamed_and_re_laid_out() -> None:
    from seqcls.serving.layout import _trial_config

    options = _options()
    snapshot = render_config(PROJECT_ROOT / "model_repository", "seqcls_model", options, version=3, num_labels=7)
    config = json.loads(_trial_config(snapshot, "seqcls_model.layout-2x1", "2x1"))
    assert config["name"] == "seqcls_model.layout-2x1" and "versionPolicy" not in config
    assert config["instanceGroup"] == [{"count": 2, "kind": "KIND_CPU"}]
    assert config["parameters"]["intra_op_threads"] == {"stringValue": "1"}
    assert config["parameters"]["batching"] == {"stringValue": "per-text"}  # everything else is the version's
    with pytest.raises(InputError, match="SEQCLS_SERVING_LAYOUT"):
        _trial_config(snapshot, "x", "2by1")
