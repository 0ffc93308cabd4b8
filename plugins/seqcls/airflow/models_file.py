"""The models file: which classifiers get a release DAG, each with its schedule, checkpoints,
release-parameter defaults and Connections — one small declarative file instead of copied DAGs.

``dags/seqcls_release.py`` builds one DAG per entry (:func:`release_models`). Location: the
``SEQCLS_MODELS_FILE`` setting, else ``seqcls-models.yaml`` beside the DAG file when it exists;
no file (or ``SEQCLS_MODELS_FILE=none``) → the single DAG ``seqcls_release`` for
``SEQCLS_MODEL_NAME`` / ``SEQCLS_SCHEDULE``, as before. ``.yaml``/``.yml``, ``.json`` or ``.toml``::

    defaults:                        # optional, under every model (a model's own keys win)
      triton_conn_id: triton_default
      params: {profile: fp32-fused}
    models:
      - name: alpha                  # MLflow model + Triton names (seqcls.contract.names)
        schedule: asset              # manual (default) | a cron expression / preset | asset
        checkpoints_root: /data/alpha  # the only place its runs take checkpoints (and `latest`) from;
                                       # default <SEQCLS_CHECKPOINTS_ROOT>/<name>; not a run param
        eval_set: eval/alpha-test.txt  # the quality gate's labeled texts, under checkpoints_root (default of
                                       # the eval_set param; PaddleNLP text<TAB>label,label or JSONL)
        serving: {pipeline: direct, layout: 2x1}  # its serving spec (profile runtime pipeline device layout
                                                  # metrics): the param defaults; the environment's only below
        params: {threshold: 0.6, thresholds: {"体育##夺冠": 0.7}}
      - name: beta
        mlflow_conn_id: mlflow_beta
        approval: required           # none (default) | required: a person approves before it goes live
        notify:                      # Apprise URLs told every outcome of its runs (or one string, space-separated)
          - mailto://ops@example.com?smtp=smtp.example.com
          - json://hooks.example.com/seqcls
        notify_conn_id: apprise_ops  # and/or an Airflow Connection of type `apprise` (its `config` extra)

The file is checked strictly when the DAG file is parsed, so a mistake is an import error in the
Airflow UI naming the file, the model and the key: unknown keys, duplicate keys or model names,
names Triton/MLflow cannot take, release params :class:`~seqcls.config.ReleaseConfig` refuses.
``approval: required`` puts a human approval task (Airflow's ``ApprovalOperator``) between the smoke
test and the exposure of that model's release: what the gates measured is shown to a person, who
approves (it goes live) or rejects (it is withdrawn like a failed smoke test) — for models where a
passed gate is necessary but not sufficient. ``none`` (default): no such task, the DAG as without it.

``notify`` (also under ``defaults``; ``notify: []`` opts a model out of the defaults'): the Apprise URLs
the run's ``report_outcome`` task tells how the run ended — promoted, refused (preflight, a gate, the
approver) with the reason, failed (and withdrawn), :mod:`seqcls.notify`. Each URL is checked with Apprise
here and an error names its position and scheme, never the URL (it may carry a password or token).
``notify_conn_id`` names an Airflow Connection of type ``apprise`` (``apache-airflow-providers-apprise``)
to send through as well: the secret then lives in Airflow's Connections, not in this file. Neither is a
run param: they are fixed when the file is parsed, and not written to the serialized DAG.

Imports nothing from Airflow (the DAG file validates the schedules with Airflow's timetables).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import Any

from seqcls.config import ReleaseConfig
from seqcls.contract.names import ModelName
from seqcls.errors import InputError
from seqcls.notify import check_urls
from seqcls.settings import (
    DEFAULT_MODEL_NAME,
    ENV_MODEL_NAME,
    ENV_MODELS_FILE,
    ENV_NOTIFY_URLS,
    ENV_SCHEDULE,
    GC_MLFLOW_POLICIES,
    dag_model_name,
    dag_models_file,
    dag_schedule,
    notify_urls,
)

MODELS_FILE_NAME = "seqcls-models.yaml"
DAG_ID = "seqcls_release"
ASSET_SCHEDULE = "asset"
MANUAL = ("", "none", "manual")
#: Keys of one model entry; ``defaults`` takes the same keys but ``name`` and ``checkpoints_root``.
MODEL_KEYS = (
    "name",
    "schedule",
    "checkpoints_root",
    "eval_set",
    "serving",
    "params",
    "triton_conn_id",
    "mlflow_conn_id",
    "approval",
    "notify",
    "notify_conn_id",
)
DEFAULT_KEYS = tuple(k for k in MODEL_KEYS if k not in ("name", "checkpoints_root", "eval_set"))
TOP_KEYS = ("defaults", "models")
#: Run-level params a model may default besides the release parameters.
RUN_PARAMS = ("skip_if_champion", "keep_refused", "mlflow_versions", "evidence_keep", "statelog_rotate_bytes")
#: The ``serving:`` block: the model's serving spec (:class:`~seqcls.spec.ServingSpec`), key → release param.
SERVING_KEYS = {
    "profile": "profile",
    "runtime": "runtime",
    "pipeline": "pipeline",
    "device": "device",
    "layout": "layout",
    "metrics": "serving_metrics",
}
CONN_DEFAULTS = {"triton_conn_id": "triton_default", "mlflow_conn_id": "mlflow_default"}
#: ``approval`` values: no human step (default), or a human approves each release before it is exposed.
APPROVAL_NONE = "none"
APPROVAL_REQUIRED = "required"
APPROVALS = (APPROVAL_NONE, APPROVAL_REQUIRED)


@dataclass(frozen=True)
class ModelSpec:
    """One release DAG: the model it releases and its parse-time configuration."""

    name: ModelName
    schedule: str | None = None  # None = manual, "asset", or a cron expression / preset
    checkpoints_root: str = ""  # "" = SEQCLS_CHECKPOINTS_ROOT; relative = under it
    params: dict[str, Any] = field(default_factory=dict)  # DAG param defaults (validated)
    source: Path | None = None  # the models file it came from (None: the environment)
    approval: str = APPROVAL_NONE  # "required": a human approves between smoke_test and expose_version
    #: Apprise URLs told each run's outcome; never in repr or a log line (they may carry secrets).
    notify: tuple[str, ...] = field(default=(), repr=False)
    notify_conn_id: str | None = None  # an Airflow Connection of type `apprise` to send through too

    @property
    def approval_required(self) -> bool:
        return self.approval == APPROVAL_REQUIRED

    @property
    def dag_id(self) -> str:
        """From a models file: :func:`dag_id_for`; without one, always ``seqcls_release`` (as before)."""
        return dag_id_for(self.name) if self.source else DAG_ID

    def where(self) -> str:
        """How errors name this model: the file and the model, or the environment."""
        return f"{self.source}: model {self.name!r}" if self.source else f"{ENV_MODEL_NAME}={self.name!r}"


def _checked_name(text: str, where: str) -> ModelName:
    try:
        return ModelName(text)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from exc


def dag_id_for(model_name: str) -> str:
    """``seqcls_release`` for the default model, ``seqcls_release__<model>`` for the others."""
    return DAG_ID if model_name == DEFAULT_MODEL_NAME else f"{DAG_ID}__{model_name}"


def release_models(dag_folder: Path) -> tuple[ModelSpec, ...]:
    """The models the release DAG file builds a DAG for (see the module doc)."""
    path = models_file(dag_folder)
    if path is None:
        schedule = _schedule(dag_schedule(), f"{ENV_SCHEDULE}")
        notify = check_urls(notify_urls(), ENV_NOTIFY_URLS)
        name = _checked_name(dag_model_name(), f"{ENV_MODEL_NAME}")
        return (ModelSpec(name, schedule=schedule, notify=notify),)
    if dag_schedule().strip() or dag_model_name() != DEFAULT_MODEL_NAME:
        raise InputError(
            f"{path}: this models file defines the release DAGs, but {ENV_SCHEDULE}/{ENV_MODEL_NAME} are set too "
            f"(they configure the single DAG used without a models file): set the schedule per model in the file "
            f"(or under `defaults:`) and unset them, or set {ENV_MODELS_FILE}=none to keep the single DAG."
        )
    return load_models(path)


def sync_groups(specs: tuple[ModelSpec, ...]) -> list[dict[str, Any]]:
    """What ``seqcls_sync`` reconciles through which Connections.

    Per Triton Connection whose models share one MLflow Connection: every model of its repository
    (``models`` None, listed or not — as without a models file); where models of one Triton use
    different MLflow Connections: each pair with its listed models (so no champion is mirrored to
    the wrong MLflow).
    """
    if not any(s.source for s in specs):
        return [{**CONN_DEFAULTS, "models": None}]
    pairs: dict[str, dict[str, list[str]]] = {}
    for s in specs:
        pairs.setdefault(s.params["triton_conn_id"], {}).setdefault(s.params["mlflow_conn_id"], []).append(s.name)
    groups = []
    for triton, by_mlflow in pairs.items():
        whole = len(by_mlflow) == 1
        for mlflow, names in by_mlflow.items():
            groups.append({"triton_conn_id": triton, "mlflow_conn_id": mlflow, "models": None if whole else names})
    return groups


def models_file(dag_folder: Path) -> Path | None:
    """``SEQCLS_MODELS_FILE`` (must exist), else ``seqcls-models.yaml`` in ``dag_folder`` if present."""
    raw = dag_models_file().strip()
    if raw.lower() == "none":
        return None
    if raw:
        path = Path(raw).expanduser()
        if not path.is_file():
            raise InputError(f"{ENV_MODELS_FILE}={raw!r}: no such file (unset it or set it to 'none' for one DAG)")
        return path
    path = Path(dag_folder) / MODELS_FILE_NAME
    return path if path.is_file() else None


def load_models(path: Path) -> tuple[ModelSpec, ...]:
    """Every model of the file at ``path``, validated (InputError naming the file, model and key)."""
    path = Path(path)
    data = _read(path)
    if not isinstance(data, Mapping):
        raise InputError(f"{path}: expected a mapping with `models:` (a list of models), got {type(data).__name__}")
    _known(data, TOP_KEYS, f"{path}")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, Mapping):
        raise InputError(f"{path}: `defaults` must be a mapping, got {type(defaults).__name__}")
    _known(defaults, DEFAULT_KEYS, f"{path}: defaults")
    entries = data.get("models")
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{path}: `models` must be a non-empty list of models (each a mapping with `name`)")
    specs: list[ModelSpec] = []
    for i, entry in enumerate(entries):
        spec = _model(path, i, entry, defaults)
        if any(s.name == spec.name for s in specs):
            raise InputError(f"{path}: model {spec.name!r} is listed twice (model names must be unique)")
        specs.append(spec)
    return tuple(specs)


def _model(path: Path, index: int, entry: Any, defaults: Mapping[str, Any]) -> ModelSpec:
    if not isinstance(entry, Mapping):
        raise InputError(f"{path}: models[{index}] must be a mapping with `name`, got {entry!r}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(f"{path}: models[{index}] needs a `name` (a string), got {name!r}")
    where = f"{path}: model {name!r}"
    _known(entry, MODEL_KEYS, where)
    name = _checked_name(name, f"{where}: name")
    for label, params in (("defaults.params", defaults.get("params")), ("params", entry.get("params"))):
        if params is not None and not isinstance(params, Mapping):
            raise InputError(f"{where}: {label} must be a mapping param -> default, got {params!r}")
    merged = {**defaults, **entry, "params": {**(defaults.get("params") or {}), **(entry.get("params") or {})}}
    for key in CONN_DEFAULTS:
        value = merged.get(key, CONN_DEFAULTS[key])
        if not isinstance(value, str) or not value.strip():
            raise InputError(f"{where}: {key}: must be a Connection id (a non-empty string), got {value!r}")
        merged[key] = value.strip()
    if "eval_set" in entry:
        merged["params"] = {**merged["params"], "eval_set": _eval_set(entry, f"{where}: eval_set")}
    merged["params"] = {**merged["params"], **_serving(defaults, entry, merged["params"], where)}
    params = {**_params(where, name, merged["params"]), **{k: merged[k] for k in CONN_DEFAULTS}}
    default_root = "" if name == DEFAULT_MODEL_NAME else name
    return ModelSpec(
        name=name,
        schedule=_schedule(merged.get("schedule"), f"{where}: schedule"),
        checkpoints_root=_root(merged.get("checkpoints_root", default_root), f"{where}: checkpoints_root"),
        params=params,
        source=path,
        approval=_approval(merged.get("approval", APPROVAL_NONE), f"{where}: approval"),
        notify=check_urls(merged.get("notify"), f"{where}: notify"),
        notify_conn_id=_conn_id(merged.get("notify_conn_id"), f"{where}: notify_conn_id"),
    )


def _params(where: str, name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Release-param (and run-param) defaults, each checked by the config table."""
    release = [f.name for f in fields(ReleaseConfig) if f.name != "model_name"]
    if "model_name" in params:
        raise InputError(f"{where}: params.model_name: the model's name is its `name` key, not a param")
    _known(params, (*release, *RUN_PARAMS), f"{where}: params")
    # each key checked alone — but a loosened rule with the override (and reason) the entry gives for it
    overriding = {k: params[k] for k in ("override", "override_reason") if k in params}
    for key, value in params.items():
        try:
            if key == "skip_if_champion" and not isinstance(value, bool):
                raise InputError(f"skip_if_champion must be true or false, got {value!r}")
            if key == "keep_refused" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InputError(f"keep_refused must be a whole number ≥ 0 (refused attempts kept), got {value!r}")
            if key == "evidence_keep" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InputError(f"evidence_keep must be a whole number ≥ 0 (releases kept as is), got {value!r}")
            if key == "statelog_rotate_bytes" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InputError(f"statelog_rotate_bytes must be a whole number of bytes ≥ 1, got {value!r}")
            if key == "mlflow_versions" and value not in GC_MLFLOW_POLICIES:
                raise InputError(f"mlflow_versions must be one of {', '.join(GC_MLFLOW_POLICIES)}, got {value!r}")
            if key in release:
                ReleaseConfig.from_dict({**overriding, key: value})
        except InputError as exc:
            raise InputError(f"{where}: params.{key}: {exc}") from exc
    try:  # the combination too (rules across fields), with this model's name
        ReleaseConfig.from_dict({**{k: v for k, v in params.items() if k in release}, "model_name": name})
    except InputError as exc:
        raise InputError(f"{where}: params: {exc}") from exc
    return dict(params)


def _serving(defaults: Mapping[str, Any], entry: Mapping[str, Any], params: Mapping[str, Any], where: str) -> dict:
    """The ``serving:`` block (``defaults``' under the model's own, key by key) as release-param defaults;
    each setting once: not also under ``params`` (either's). ``metrics`` may be on/off or true/false."""
    block: dict[str, Any] = {}
    for label, source in (("defaults.serving", defaults), ("serving", entry)):
        value = source.get("serving")
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise InputError(f"{where}: {label} must be a mapping ({', '.join(SERVING_KEYS)}), got {value!r}")
        _known(value, tuple(SERVING_KEYS), f"{where}: {label}")
        block.update(value)
    out = {}
    for key, value in block.items():
        param = SERVING_KEYS[key]
        if param in params:
            raise InputError(f"{where}: serving.{key} is given twice (also as params.{param}); keep one")
        if key == "metrics" and isinstance(value, bool):
            value = "on" if value else "off"
        out[param] = value
    return out


def _eval_set(entry: Mapping[str, Any], where: str) -> str:
    """The model's labeled eval set: a path under its checkpoints root (relative to it, no ``..``), the
    default of its ``eval_set`` param — once: not also under ``params``."""
    value = entry["eval_set"]
    if "eval_set" in (entry.get("params") or {}):
        raise InputError(f"{where}: given twice (also as params.eval_set); keep one")
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: expected a file path under the model's checkpoints root, got {value!r}")
    text = value.strip()
    if not Path(text).is_absolute() and ".." in PurePosixPath(text).parts:
        raise InputError(f"{where}: {text!r}: '..' is not allowed (the eval set lives under the checkpoints root)")
    return text


def _schedule(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError(f"{where}: expected manual, asset or a cron expression / preset (a string), got {value!r}")
    text = value.strip()
    if text.lower() in MANUAL:
        return None
    if text.lower() == ASSET_SCHEDULE:
        return ASSET_SCHEDULE
    if text in ("@continuous", "@once"):
        raise InputError(f"{where}: {text} is not a release schedule: use manual, asset or a cron expression")
    return text  # a cron expression or preset; the DAG file validates it with Airflow's timetable


def _approval(value: Any, where: str) -> str:
    if value not in APPROVALS:  # strings only: YAML's true/yes would be a guess at what was meant
        raise InputError(
            f"{where}: expected {' or '.join(APPROVALS)} (required: a person approves each release between "
            f"smoke_test and expose_version), got {value!r}"
        )
    return value


def _conn_id(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: must be a Connection id (a non-empty string), got {value!r}")
    return value.strip()


def _root(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{where}: expected a directory (a string), got {value!r}")
    text = value.strip()
    if text and not Path(text).expanduser().is_absolute() and ".." in PurePosixPath(text).parts:
        raise InputError(f"{where}: {text!r}: '..' is not allowed in a path relative to the checkpoints root")
    return text


def _known(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = [str(k) for k in data if k not in allowed]
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(allowed)})")


def _read(path: Path) -> Any:
    """The file's data; duplicate keys (which YAML and JSON would silently collapse) are an error."""
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read the models file: {exc}") from exc
    try:
        if suffix in (".yaml", ".yml"):
            return _yaml(text)
        if suffix == ".json":
            return json.loads(text, object_pairs_hook=_unique_pairs)
        if suffix == ".toml":
            import tomllib

            return tomllib.loads(text)  # TOML itself refuses duplicate keys
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from exc
    except ValueError as exc:  # json / toml syntax errors
        raise InputError(f"{path}: not valid {suffix[1:].upper()}: {exc}") from exc
    raise InputError(f"{path}: unsupported models file type {suffix!r} (use .yaml, .yml, .json or .toml)")


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InputError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _yaml(text: str) -> Any:
    import yaml  # PyYAML: a dependency of Airflow itself

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
            dupes = sorted({str(k) for k in keys if keys.count(k) > 1})
            if dupes:
                raise InputError(f"duplicate key(s) {', '.join(dupes)} (line {node.start_mark.line + 1})")
            return super().construct_mapping(node, deep=deep)

    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass: plain data only
    except yaml.YAMLError as exc:
        raise InputError(f"not valid YAML: {exc}") from exc


__all__ = [
    "APPROVALS",
    "APPROVAL_NONE",
    "APPROVAL_REQUIRED",
    "DAG_ID",
    "MODELS_FILE_NAME",
    "ModelSpec",
    "dag_id_for",
    "load_models",
    "models_file",
    "release_models",
    "sync_groups",
]
