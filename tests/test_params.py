"""The trigger form's Params (issue 25, "a form that cannot lie"): tolerances typed as text reach the
release exactly as typed, a bad one is refused naming the param, and the form opens with the everyday
params, the gates' tolerances and the expert knobs in their own sections.

Airflow 3.3's number widget rounds what is typed (``1e-8`` in *Parity atol* was sent as ``1``), so every
``number`` release parameter is a text field in the form (``type: [string, number]`` with a pattern and
examples: Airflow's plain text input), parsed with ``float()`` by :meth:`ReleaseConfig.from_dict`; a
REST conf or a models-file default may still give a JSON number. The CLI keeps its float flags.
"""

from __future__ import annotations

import pytest

from tests.helpers.airflow import private_airflow_home

AIRFLOW_HOME = private_airflow_home()  # before anything imports airflow

NUMBERS = (
    "threshold",
    "atol",
    "rtol",
    "prob_atol",
    "near_margin",
    "gpu_tolerance_factor",
    "min_decision_agreement",
    "min_micro_f1",
    "min_macro_f1",
    "max_f1_drop",
    "max_f1_drop_relative",
    "max_level_f1_drop",
    "max_label_f1_drop",
    "max_profile_f1_drop",
)


def _param(name: str, defaults: dict | None = None):
    from seqcls.airflow.params import dag_params

    return dag_params("seqcls", defaults)[name]


def _override_if_loosened(name: str, value: float) -> dict[str, str]:
    """The override a looser-than-default value needs (loosening a rule is an override of its gate)."""
    from seqcls import config

    gate = {**config.LOOSER_WHEN_LARGER, **config.LOOSER_WHEN_SMALLER}.get(name)
    default = getattr(config.DEFAULTS, name)
    larger = name in config.LOOSER_WHEN_LARGER
    if gate is None or default is None or not (value > default if larger else value < default):
        return {}
    return {"override": gate, "override_reason": "a suggested value, taken knowingly"}


def test_every_number_param_is_a_text_field_that_keeps_what_was_typed() -> None:
    from seqcls import config
    from seqcls.airflow.context import config_from_params
    from seqcls.airflow.params import schemas

    form = schemas("seqcls")
    assert sorted(f.name for f in config.FIELDS if f.type == "number") == sorted(NUMBERS)
    for name in NUMBERS:
        schema = form[name]
        # Airflow's UI picks its plain text input for a first type "string" with examples (no number widget)
        assert schema["type"][:2] == ["string", "number"] and schema["examples"] and schema["pattern"], schema
        for example in schema["examples"]:  # what the form suggests is itself a valid value
            assert _param(name).resolve(example) == example
            given = {name: example, **_override_if_loosened(name, float(example))}
            assert getattr(config_from_params(given), name) == float(example)
    cfg = config_from_params({"atol": "1e-8", "rtol": " 2.5E-7 ", "prob_atol": "0.00000001", "threshold": ".35"})
    assert (cfg.atol, cfg.rtol, cfg.prob_atol, cfg.threshold) == (1e-8, 2.5e-7, 1e-8, 0.35)
    assert _param("atol").resolve("1e-8") == "1e-8"  # the trigger's schema check passes the text as typed
    assert _param("atol").resolve(1e-8) == 1e-8  # a REST conf with a JSON number still validates
    assert config_from_params({"atol": 1e-8}).atol == 1e-8


@pytest.mark.parametrize(
    ("name", "typed", "message"),
    [
        ("atol", "1e-8x", r"atol must be a number in \[0, 1\] written like 1e-4 or 0\.0001, got '1e-8x'"),
        ("atol", "nan", r"atol must be a number .* got 'nan'"),
        ("rtol", "inf", r"rtol must be a number .* got 'inf'"),
        ("atol", "1_0", r"atol must be a number .* got '1_0'"),
        ("atol", "-1e-4", r"atol must be a number .* got '-1e-4'"),
        ("atol", "5", r"atol must be a number in \[0, 1\], got 5\.0"),
        ("threshold", "1", r"threshold must be a number strictly between 0 and 1, got 1\.0"),
        ("max_f1_drop", "0,02", r"max_f1_drop must be a number .* got '0,02'"),
    ],
)
def test_a_bad_text_value_is_refused_naming_the_param(name: str, typed: str, message: str) -> None:
    from seqcls.airflow.context import config_from_params
    from seqcls.errors import InputError

    with pytest.raises(InputError, match=message):
        config_from_params({name: typed})


def test_the_trigger_schema_refuses_what_is_not_a_number() -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    for typed in ("1e-8x", "abc", "-1", "nan", ""):
        with pytest.raises(ParamValidationError):
            _param("atol").resolve(typed)
    with pytest.raises(ParamValidationError):
        _param("atol").resolve(2.0)  # a JSON number keeps its range check at trigger time
    assert _param("prob_atol").resolve(None) is None  # an emptied optional field


def test_form_sections_everyday_first_then_gates_then_expert() -> None:
    from seqcls import config
    from seqcls.airflow.params import schemas

    form = schemas("seqcls")
    names = list(form)
    assert names[:4] == ["checkpoint", "model_name", "profile", "skip_if_champion"]
    sections = [form[n].get("section") for n in names]
    order = list(dict.fromkeys(sections))
    assert order == [None, config.SERVING_SECTION, config.GATE_SECTION, config.EXPERT_SECTION], order  # one block each
    everyday = {n for n in names if form[n].get("section") is None}
    gates = {n for n in names if form[n].get("section") == config.GATE_SECTION}
    assert everyday == {
        "checkpoint",
        "model_name",
        "profile",
        "skip_if_champion",
        "eval_set",
        "threshold",
        "thresholds",
    }
    assert {"atol", "rtol", "prob_atol", "min_decision_agreement", "max_f1_drop", "min_label_support"} <= gates
    serving = {n for n in names if form[n].get("section") == config.SERVING_SECTION}
    assert serving == {"runtime", "pipeline", "device", "layout", "serving_metrics"}  # the serving spec, profile aside
    assert {"opset", "triton_conn_id", "mlflow_conn_id", "allow_unsafe_pickle"} <= set(names) - gates - serving
    assert all(form[n].get("description") for n in names), [n for n in names if not form[n].get("description")]


def test_a_models_file_default_written_as_text_is_a_valid_form_default() -> None:
    from seqcls.airflow.context import config_from_params
    from seqcls.airflow.params import schemas

    form = schemas("alpha", {"atol": "1e-5", "max_f1_drop": 0.01})
    for name in ("atol", "max_f1_drop"):
        assert _param(name, {"atol": "1e-5", "max_f1_drop": 0.01}).resolve() == form[name]["default"]
    assert config_from_params({"atol": form["atol"]["default"]}).atol == 1e-5


def test_models_file_accepts_yaml_exponents(tmp_path) -> None:
    """PyYAML reads ``1e-5`` (no dot) as a string: a models file writing it is now a valid default."""
    from seqcls.airflow.models_file import load_models

    path = tmp_path / "models.yaml"
    path.write_text("models:\n  - name: alpha\n    params: {atol: 1e-5, rtol: 1.0e-4}\n", encoding="utf-8")
    (spec,) = load_models(path)
    assert (spec.params["atol"], spec.params["rtol"]) == ("1e-5", 1e-4)
    assert _param("atol", spec.params).resolve() == "1e-5"


def test_cli_flags_stay_floats(capsys: pytest.CaptureFixture[str]) -> None:
    from seqcls.cli import build_parser

    args = build_parser().parse_args(["release", "--checkpoint", "ckpt", "--atol", "1e-8", "--max-f1-drop", "0.01"])
    assert args.atol == 1e-8 and isinstance(args.atol, float) and args.max_f1_drop == 0.01
    with pytest.raises(SystemExit):
        build_parser().parse_args(["release", "--checkpoint", "ckpt", "--atol", "abc"])
    assert "invalid float value: 'abc'" in capsys.readouterr().err
