"""The host's serving layout (``SEQCLS_SERVING_LAYOUT``): instances × threads of the ONNX model, set explicitly."""

from __future__ import annotations

import pytest

from seqcls.errors import InputError
from seqcls.serving.repository import ServingOptions, render_config
from seqcls.settings import PROJECT_ROOT, Settings


def test_layout_from_the_environment_reaches_the_rendered_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQCLS_SERVING_LAYOUT", "2x1")
    options = ServingOptions.from_settings(Settings.from_env())
    assert (options.model_instances, options.intra_op_threads) == (2, 1)
    text = render_config(PROJECT_ROOT / "model_repository", "seqcls_model", options, version=1, num_labels=7)
    assert "count: 2 kind: KIND_CPU" in text and 'key: "intra_op_threads" value: { string_value: "1" }' in text
    monkeypatch.delenv("SEQCLS_SERVING_LAYOUT")
    default = ServingOptions.from_settings(Settings.from_env())
    assert (default.model_instances, default.intra_op_threads) == (1, 2)
    # an explicit override (the bench's variants) still wins over the host's layout
    monkeypatch.setenv("SEQCLS_SERVING_LAYOUT", "2x1")
    assert ServingOptions.from_settings(Settings.from_env(), model_instances=3).model_instances == 3


@pytest.mark.parametrize("bad", ["2", "2x", "x1", "0x2", "2x0", "two x one", "2x1x1", "100x1"])
def test_a_bad_layout_names_the_variable(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("SEQCLS_SERVING_LAYOUT", bad)
    with pytest.raises(InputError, match="SEQCLS_SERVING_LAYOUT="):
        Settings.from_env()
