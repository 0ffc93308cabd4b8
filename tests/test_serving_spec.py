"""The serving spec: one record per release, resolved where the release starts, recorded, and what later tasks use.

A worker's environment (``SEQCLS_RUNTIME``, ``SEQCLS_DEVICE``, ``SEQCLS_SERVING_*``) only supplies defaults:
the release's params win, and a later task re-opening the run's release publishes what resolve recorded,
whatever its own environment says. Real intake on a tiny checkpoint; rendering through the real templates.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from seqcls.airflow.context import open_for_task
from seqcls.airflow.models_file import load_models
from seqcls.config import ReleaseConfig, serving_spec
from seqcls.errors import InputError
from seqcls.release.intake import open_release, reopen_release
from seqcls.serving.repository import ServingOptions
from seqcls.settings import Settings
from seqcls.spec import ServingSpec


def test_params_win_over_the_environment_which_wins_over_the_built_in_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEQCLS_SERVING_PIPELINE", raising=False)
    assert serving_spec(ReleaseConfig(), Settings.from_env()) == ServingSpec()
    monkeypatch.setenv("SEQCLS_SERVING_PIPELINE", "direct")
    monkeypatch.setenv("SEQCLS_SERVING_LAYOUT", "2x1")
    monkeypatch.setenv("SEQCLS_SERVING_METRICS", "off")
    env = serving_spec(ReleaseConfig(), Settings.from_env())
    assert (env.pipeline, env.layout, env.metrics) == ("direct", "2x1", False)
    mine = serving_spec(ReleaseConfig(pipeline="ensemble", layout="1X2", serving_metrics="on"), Settings.from_env())
    assert (mine.pipeline, mine.layout, mine.metrics) == ("ensemble", "1x2", True)
    gpu = serving_spec(ReleaseConfig(device="gpu"), Settings())
    assert gpu.runtime == "onnxruntime" and ServingOptions.from_spec(gpu).padding == "buckets"


@pytest.mark.parametrize(
    ("params", "why"),
    [
        ({"pipeline": "direct", "runtime": "onnxruntime"}, "pipeline 'direct' runs the ONNX model in its python step"),
        ({"device": "gpu", "runtime": "python-onnxruntime"}, "serving on a GPU needs runtime 'onnxruntime'"),
        ({"layout": "0x2"}, "layout='0x2': instances in 1..64"),
        ({"serving_metrics": "maybe"}, "serving_metrics must be one of on, off"),
    ],
)
def test_a_spec_that_cannot_be_served_is_refused_naming_the_setting(params: dict, why: str) -> None:
    with pytest.raises(InputError, match=why):
        serving_spec(ReleaseConfig.from_dict(params), Settings())


def test_a_later_task_publishes_what_resolve_recorded_not_its_own_environment(
    tiny_checkpoint: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEQCLS_SERVING_PIPELINE", "direct")  # the resolving worker's default
    monkeypatch.setenv("SEQCLS_SERVING_LAYOUT", "2x1")
    resolved = open_release(tiny_checkpoint, ReleaseConfig(serving_metrics="off"), Settings.from_env())
    assert resolved.workspace.read()["serving"] == resolved.serving.to_dict()
    assert (resolved.serving.pipeline, resolved.serving.layout, resolved.serving.metrics) == ("direct", "2x1", False)

    monkeypatch.delenv("SEQCLS_SERVING_PIPELINE")  # another worker, another environment
    monkeypatch.setenv("SEQCLS_SERVING_LAYOUT", "1x2")
    fp = resolved.checkpoint.fingerprint
    later = reopen_release(Settings.from_env(), ReleaseConfig(serving_metrics="off"), fp)
    assert later.serving == resolved.serving
    task = open_for_task(str(tiny_checkpoint), {"serving_metrics": "off"}, Settings.from_env(), fingerprint=fp)
    assert task.serving == resolved.serving  # the Airflow task path: the same record
    explicit = reopen_release(Settings.from_env(), ReleaseConfig(layout="1x1", serving_metrics="off"), fp)
    assert explicit.serving.layout == "1x1" and explicit.serving.pipeline == "direct"  # a param still wins


def test_the_models_file_serving_block_becomes_the_param_defaults(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        "defaults:\n  serving: {runtime: python-onnxruntime, metrics: false}\n"
        "models:\n  - name: alpha\n    serving: {pipeline: direct, layout: 2x1, profile: int8}\n  - name: beta\n"
    )
    alpha, beta = load_models(path)
    assert {k: alpha.params[k] for k in ("runtime", "serving_metrics", "pipeline", "layout", "profile")} == {
        "runtime": "python-onnxruntime",
        "serving_metrics": "off",
        "pipeline": "direct",
        "layout": "2x1",
        "profile": "int8",
    }
    assert beta.params["serving_metrics"] == "off" and "pipeline" not in beta.params
    twice = tmp_path / "twice.yaml"
    twice.write_text("models:\n  - name: alpha\n    serving: {pipeline: direct}\n    params: {pipeline: ensemble}\n")
    with pytest.raises(InputError, match=r"model 'alpha': serving\.pipeline is given twice"):
        load_models(twice)
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - name: alpha\n    serving: {pipeline: direct, runtime: onnxruntime}\n")
    with pytest.raises(InputError, match="model 'alpha': params: serving pipeline 'direct'"):
        load_models(bad)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("models:\n  - name: alpha\n    serving: {instances: 2}\n")
    with pytest.raises(InputError, match="instances"):
        load_models(unknown)
