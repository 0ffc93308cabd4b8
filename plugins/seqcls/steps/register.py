"""Step 4 — register: the validated release as an MLflow model version with lineage, alias ``candidate``.

One run per release attempt in experiment ``seqcls-<model>`` — the run validate opened with the
parity evidence (:mod:`seqcls.registry.runs`), else a new one — with params, every parity figure as a
metric and artifacts: the **pyfunc model** (:mod:`seqcls.registry.pyfunc`: texts → label names and
probabilities, what Triton answers, with the served ONNX graph, ``vocab.txt``, the version's
``release.json`` and Triton's own tokenizer/decision files as code), the static Paddle model,
tokenizer and label files, parity report + plot; then a model version tagged with lineage and
alias ``candidate``. One version per (fingerprint, serving configuration): the version is tagged
with :func:`seqcls.release.keys.release_key` and a readable ``serving_config`` JSON, and Airflow
retries and re-runs with the same key return it; the same checkpoint with another threshold,
profile, opset, max_length or hierarchy is another version. Versions registered before release
keys (no ``release_key`` tag) are never reused: their serving configuration is not recorded.
MLflow access shared with promote/rollback lives in :mod:`seqcls.registry.ledger`.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls import faults
from seqcls.checkpoints.torchload import describe
from seqcls.contract import shipped
from seqcls.errors import StepOrderError
from seqcls.frameworks import for_checkpoint
from seqcls.registry import journal, runs
from seqcls.registry.archive import ARCHIVED_TAG
from seqcls.registry.ledger import (
    CANDIDATE,
    RELEASE_KEY_TAG,
    SERVING_CONFIG_TAG,
    aliased_version,
    client,
    find_version,
    is_not_found,
    mlflow_failed,
)
from seqcls.registry.runs import OVERRIDE_TAG
from seqcls.release import verdicts
from seqcls.release.control import release_owner
from seqcls.release.keys import float32, key_of, release_values, serving_config
from seqcls.release.records import (
    OUT_DIRS,
    Expected,
    ParityReport,
    Registered,
    fp32_onnx,
    served_onnx,
    serving_tokenizer,
    static_dir,
)
from seqcls.release.workspace import Release, StepResult, package_versions
from seqcls.serving.repository import ServingOptions
from seqcls.serving.statelog import actor
from seqcls.settings import Settings
from seqcls.steps import require

log = logging.getLogger(__name__)

STEP = "register"
OUT_DIR = OUT_DIRS[STEP]
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
#: The MLflow model's code (logged as code: MLflow stores this file in the model).
PYFUNC_CODE = Path(runs.__file__).resolve().with_name("pyfunc.py")
#: What that code imports, pinned to this environment's versions (mlflow pins itself).
PYFUNC_PACKAGES = ("onnxruntime", "numpy", "pandas", "tokenizers")


def lineage_tags(
    release: Release, report: ParityReport, versions: dict[str, str | None], config: dict[str, Any]
) -> dict[str, str]:
    """Model-version tags that answer "where did this come from, what does it serve" without opening the run."""
    cfg, ckpt = release.config, release.checkpoint
    used = for_checkpoint(ckpt).packages  # this framework's toolchain: a Paddle release names no torch
    tags = {
        RELEASE_KEY_TAG: key_of(config),
        SERVING_CONFIG_TAG: json.dumps(config, sort_keys=True, ensure_ascii=False),
        "fingerprint": ckpt.fingerprint,
        "framework": ckpt.framework,
        "architecture": ckpt.architecture,
        "opset": str(cfg.opset),
        "profile": cfg.profile,  # as configured ("auto" included)
        "profile_chosen": report.profile,  # what is served and was gated
        "seqcls_version": str(versions.get("seqcls")),
        "num_labels": str(ckpt.num_labels),
        "parity.logits_max_abs_diff": str(report.numeric.get("logits_max_abs_diff")),
        "parity.decision_agreement": str(report.decisions.get("agreement")),
        **release_tags(release),
    }
    tags.update({f"version.{k}": str(v) for k, v in versions.items() if k != "seqcls" and (k in used or k in COMMON)})
    if ckpt.converted:  # the checkpoint came as a pickle: the registry says so, and from which files
        tags["checkpoint.converted"] = describe(ckpt.converted)
    return tags


#: Packages every release runs whatever its framework (the serving graph, the tokenizer).
COMMON = ("onnx", "onnxruntime", "tokenizers", "mlflow")


def release_tags(release: Release) -> dict[str, str]:
    """Who released this version, when, from which path, under which verdicts — set on every release of it
    (a re-release that reuses the version says it was released again), with the Airflow dag/run/try and the
    run's page. ``seqcls.<gate>``: the gate's verdict; ``seqcls.override.<gate>``: why it was overridden."""
    who = actor()
    tags = {
        "checkpoint": str(release.checkpoint.origin),
        "released_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "released_by": f"{who['user']}@{who['host']}",
    }
    for gate, v in verdicts.verdicts(release.workspace).items():
        tags[f"seqcls.{gate}"] = v.state
        if v.override:
            tags[OVERRIDE_TAG.format(gate=gate)] = str(v.override.get("reason", ""))[:5000]
    tags.update({f"airflow.{k}": str(who[k]) for k in ("dag_id", "run_id", "try", "run_url") if who.get(k)})
    return tags


def log_run(c, release: Release, run_id: str):
    """Log the pyfunc model and the release's files to run ``run_id``; returns the pyfunc's ModelInfo."""
    ws, ckpt = release.workspace, release.checkpoint
    info = link_model(c, run_id, log=lambda model_id: log_pyfunc(release, model_id))
    faults.point("register:artifacts")
    c.log_artifacts(run_id, str(static_dir(ws)), for_checkpoint(ckpt).artifact_dir)
    for name in TOKENIZER_FILES:
        if (ckpt.path / name).is_file():
            c.log_artifact(run_id, str(ckpt.path / name), "tokenizer")
    for path in (ckpt.config_file, ckpt.label_file):
        c.log_artifact(run_id, str(path), "checkpoint")
    if fp32_onnx(ws) != served_onnx(ws):
        c.log_artifact(run_id, str(fp32_onnx(ws)), "onnx_fp32")
    return info


def start_run(c, release: Release, validate_record: dict[str, Any], key: str) -> tuple[str, bool]:
    """Adopt validate's run (or open one: then True), tagged ``registering`` until the version exists."""
    run_id = runs.adopt_run(c, validate_record, key)
    if run_id is not None:
        c.set_tag(run_id, runs.OUTCOME_TAG, runs.REGISTERING)  # never adopted twice
        return run_id, False
    ws = release.workspace
    return runs.open_run(c, release, ParityReport.load(ws), key, parity="passed", outcome=runs.REGISTERING), True


def pyfunc_signature():
    """Texts in (one string column, ``text`` in a DataFrame); per text: labels, their confidences, every probability."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, Schema
    from mlflow.types.schema import Array

    return ModelSignature(
        inputs=Schema([ColSpec(DataType.string)]),
        outputs=Schema(
            [
                ColSpec(Array(DataType.string), "labels"),
                ColSpec(Array(DataType.double), "confidences"),
                ColSpec(Array(DataType.double), "probabilities"),
            ]
        ),
    )


#: The run's metrics the logged model carries too: the verdicts and the candidate's headline quality figures,
#: what MLflow's model list compares. The run keeps every gate figure.
MODEL_METRICS = ("numeric.passed", "decisions.passed", "decisions.agreement", "eval.passed", "eval.micro_f1",
                 "eval.macro_f1", "eval.hierarchical_f1")  # fmt: skip


def link_model(c, run_id: str, log):
    """Log a model as run ``run_id``'s output, with the run's headline metrics (:data:`MODEL_METRICS`) linked.

    Why not ``log_model`` inside the run: it copies *every* metric and param of the run onto the model, fetching
    each metric's history separately. A release's run holds about 45 gate figures and 30 params; on a team
    MLflow server behind basic auth each fetch pays a password hash, and the copies are a third of what a
    release adds to the registry's database, every day, for ever — while the run, which the version names,
    already holds them. Here the model is created for the run, filled outside it (``log(model_id)`` returns the
    ModelInfo), then listed as the run's output and given the headline metrics (their logged values,
    timestamps and steps) in one batch.
    """
    import mlflow
    from mlflow.entities import LoggedModelOutput, Metric

    run = c.get_run(run_id)
    model = mlflow.initialize_logged_model(name="model", source_run_id=run_id, experiment_id=run.info.experiment_id)
    info = log(model.model_id)
    c.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])
    logged = (Metric.from_proto(m) for m in run.data.to_proto().metrics)  # each with its timestamp and step
    metrics = [
        Metric(m.key, m.value, m.timestamp, m.step, run_id=run_id, model_id=model.model_id)
        for m in logged
        if m.key in MODEL_METRICS
    ]
    if metrics:
        c.log_batch(run_id, metrics=metrics)
    return info


def log_pyfunc(release: Release, model_id: str | None = None):
    """Log :mod:`seqcls.registry.pyfunc` as code with this release's artifacts (into logged model ``model_id``
    when given, else the active run's new one); the ModelInfo."""
    import mlflow
    import pandas as pd

    contract = shipped.contract(release.settings)
    values = release_values(release, ServingOptions.from_spec(release.serving))  # as publish writes it
    items = Expected.load(release.workspace).items
    common = shipped.common_dir(release.settings)
    with tempfile.TemporaryDirectory(prefix="seqcls-pyfunc-") as tmp:
        release_file = Path(tmp) / contract.RELEASE_FILE
        release_file.write_text(json.dumps(values, indent=1, ensure_ascii=False), encoding="utf-8")
        tok = serving_tokenizer(release)
        artifacts = {"release": str(release_file), "vocab": str(tok.file), "onnx": str(served_onnx(release.workspace))}
        if tok.kind != "tokenizer.json":  # the wordpiece tokenizer's character classes, as publish ships them:
            # loading the model (MLflow checks the input example on log) reads them, not every code point
            text = shipped.text(release.settings)
            artifacts["char_classes"] = str(text.write_char_classes(Path(tmp) / text.CHAR_CLASSES_FILE))
        return mlflow.pyfunc.log_model(
            name="model",
            python_model=str(PYFUNC_CODE),
            artifacts=artifacts,
            code_paths=[str(common / f"{name}.py") for name in shipped.MODULES],
            signature=pyfunc_signature(),
            input_example=pd.DataFrame({"text": [item.text for item in items[:2]]}),
            pip_requirements=[f"{name}=={version}" for name, version in package_versions(PYFUNC_PACKAGES).items()],
            metadata={k: values[k] for k in ("labels", "fingerprint", "release_key", "profile", "model_name")},
            model_id=model_id,
        )


def ensure_registered_model(c, settings: Settings, name: str) -> bool:
    """Create the registered model if missing (journalled first); True when this call created it."""
    from mlflow.exceptions import MlflowException

    try:
        c.get_registered_model(name)
        return False
    except MlflowException as exc:
        if not is_not_found(exc):
            raise mlflow_failed(f"reading registered model {name!r}", exc) from exc
        journal.record(settings, name, "registered_model", model=name)
        c.create_registered_model(
            name, tags={"seqcls": "true"}, description="PaddleNLP ERNIE sequence classifier released by seqcls"
        )
        return True


def register_new(release: Release, config: dict[str, Any], validate_record: dict[str, Any]) -> Registered:
    """Log the run, create the model version with lineage and serving configuration, point ``candidate`` at it.

    Each registry change is journalled before it is made (:mod:`seqcls.registry.journal`). A failure
    tags the run ``failed``; a full disk under MLflow's artifact store is a ResourceError naming it.
    """
    c = client(release.settings)
    run_id, opened = start_run(c, release, validate_record, key_of(config))
    try:
        if opened:  # validate's evidence, as validate would have logged it
            c.log_artifacts(run_id, str(release.workspace.path(OUT_DIRS["validate"])), "parity")
        reg = _new_version(c, release, config, run_id)
    except BaseException as exc:
        full = runs.out_of_space_error(runs.mark_failed(c, run_id, exc), exc, run_id)
        if full is not None:
            raise full from exc
        raise
    c.set_tag(run_id, runs.OUTCOME_TAG, runs.REGISTERED)
    c.set_terminated(run_id)
    return reg


def _new_version(c, release: Release, config: dict[str, Any], run_id: str) -> Registered:
    cfg, ckpt, settings = release.config, release.checkpoint, release.settings
    t0 = time.perf_counter()
    report = ParityReport.load(release.workspace)
    versions = package_versions()
    key = key_of(config)
    info = log_run(c, release, run_id)
    version, created_rm, previous = create_version(
        c,
        settings,
        cfg.model_name,
        run_id=run_id,
        source=info.model_uri,
        model_id=info.model_id,
        tags=lineage_tags(release, report, versions, config),
        description=f"fingerprint {ckpt.fingerprint}, serving configuration {key}",
    )
    return Registered(
        model_name=cfg.model_name,
        version=version,
        run_id=run_id,
        created=True,
        created_registered_model=created_rm,
        previous_candidate=previous,
        model_uri=f"models:/{cfg.model_name}/{version}",
        logged_model=info.model_uri,
        seconds=round(time.perf_counter() - t0, 3),
        release_key=key,
    )


def create_version(
    c,
    settings: Settings,
    name: str,
    *,
    run_id: str,
    source: str,
    tags: dict[str, str],
    description: str,
    model_id: str | None = None,
) -> tuple[int, bool, int | None]:
    """The registry half of a new version, once its run holds the model: the registered model (if new), the
    version, alias ``candidate`` — each journalled before it is made, so a dead attempt's are undone.

    Apart from the artifact logging so the registry race test drives exactly this path against a shared
    server. Returns (version, whether this call created the registered model, the previous candidate).
    """
    created_rm = ensure_registered_model(c, settings, name)
    journal.record(settings, name, "version", model=name, run_id=run_id, release_key=tags.get(RELEASE_KEY_TAG))
    mv = c.create_model_version(
        name, source=source, run_id=run_id, tags=tags, description=description, model_id=model_id
    )
    journal.record(settings, name, "created", model=name, run_id=run_id, version=int(mv.version))
    faults.point("register:version-created")
    previous = point_candidate(c, settings, name, int(mv.version), run_id)
    return int(mv.version), created_rm, previous


def point_candidate(c, settings: Settings, name: str, version: int, run_id: str | None) -> int | None:
    """Alias ``candidate`` → ``version`` (journalled first, so an undone attempt restores it); returns the
    version it pointed to before (None: unset). The candidate follows the attempt, also one reusing a version."""
    before = aliased_version(c, name, CANDIDATE)
    previous = int(before.version) if before else None
    if previous == version:
        return previous
    journal.record(settings, name, "alias", alias=CANDIDATE, target=version, previous=previous, run_id=run_id)
    c.set_registered_model_alias(name, CANDIDATE, str(version))
    return previous


def check_validated(release: Release, records: dict[str, dict[str, Any]], config: dict[str, Any]) -> None:
    """The workspace's ONNX and gate must be the ones this config asks for, or the tags would lie.

    A step run alone (``seqcls register --threshold 0.7`` after validating at 0.5) is refused,
    naming the parameters that differ; ``seqcls release`` re-runs convert/validate first.
    """
    expected, report = Expected.load(release.workspace), ParityReport.load(release.workspace)
    made = {
        "fingerprint": report.fingerprint,
        "profile": records["convert"].get("inputs", {}).get("profile", report.profile),
        "opset": records["convert"].get("inputs", {}).get("opset"),
        "max_length": expected.max_length,
        "hierarchy": expected.hierarchy,
        "thresholds": {label: float32(t) for label, t in zip(expected.labels, expected.thresholds, strict=True)},
    }
    stale = sorted(k for k in config if made.get(k) != config[k])
    if stale:
        detail = ", ".join(
            "thresholds" if k == "thresholds" else f"{k} {made.get(k)!r} (asked: {config[k]!r})" for k in stale
        )
        raise StepOrderError(
            f"{release.workspace.root}: convert/validate ran with other serving parameters than this release asks "
            f"for — {detail}; run `seqcls release` (or convert and validate) with these parameters first."
        )


def register(release: Release) -> StepResult:
    """Register the validated release (or return the version already registered for it)."""
    cfg, ckpt = release.config, release.checkpoint
    records = require(release, STEP)
    config = serving_config(release)
    check_validated(release, records, config)  # before the step: a refusal leaves its last record alone
    key = key_of(config)
    inputs = {
        "validate_outputs": records["validate"]["outputs"],
        "tracking_uri": str(release.settings.mlflow_tracking_uri),
        "model_name": cfg.model_name,
        "release_key": key,
    }

    def body(out: Path) -> tuple[dict, str]:
        dead = journal.undo_dead_attempts(release.settings, cfg.model_name)
        if dead.get("undone") or dead.get("error"):
            log.warning("register: dead attempts of %s: %s", cfg.model_name, dead)
        existing = find_version(client(release.settings), cfg.model_name, ckpt.fingerprint, release_key=key)
        # not a legacy (untagged) one, nor one gc archived (its graphs may be gone): else a new version
        if existing is not None and existing.tags.get(RELEASE_KEY_TAG) == key and ARCHIVED_TAG not in existing.tags:
            c = client(release.settings)
            version = int(existing.version)
            for tag, value in release_tags(release).items():
                c.set_model_version_tag(cfg.model_name, str(version), tag, value)
            previous = point_candidate(c, release.settings, cfg.model_name, version, existing.run_id)
            reg = Registered(cfg.model_name, version, existing.run_id, release_key=key, previous_candidate=previous)
            runs.mark_reused(c, records["validate"], key, reg.version)
            msg = (
                f"MLflow v{reg.version} already holds fingerprint {ckpt.short_fingerprint} with serving "
                f"configuration {key} — reused, alias {CANDIDATE}"
            )
        else:
            reg = register_new(release, config, records["validate"])
            msg = (
                f"registered {cfg.model_name} as MLflow v{reg.version} (serving configuration {key}, run "
                f"{str(reg.run_id)[:8]}, alias {CANDIDATE})"
            )
        (out / "registry.json").write_text(json.dumps(reg.to_dict(), indent=1), encoding="utf-8")
        return reg.to_dict(), msg

    with journal.standalone(release.settings, cfg.model_name, release_owner(release), str(release.workspace.root)):
        return release.workspace.run_step(STEP, inputs, body, out_dir=OUT_DIR, always_run=True)
