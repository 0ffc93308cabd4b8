"""The release's MLflow run: opened by validate with the parity evidence, adopted by register.

Every gate that ran leaves a run in experiment ``seqcls-<model>`` — passed or failed — holding
the gate's report and plot (``parity/report.json``, ``parity/plot.png``; ``expected.json`` when it
passed), its figures as metrics, the release parameters as params and the tags
``seqcls.gates.parity=passed|failed``, ``fingerprint``, ``release_key`` and ``seqcls.release.workspace``; the run
id is recorded in the manifest's ``validate`` record (``mlflow_run_id``), so the evidence is one
click from the task. A failed gate's run is ``FAILED`` with ``seqcls.outcome=gate_failed`` and
the gate's message in ``seqcls.gate_error``; a passed gate's run waits with
``seqcls.outcome=validated`` until ``register`` adopts it (:func:`adopt_run`; ``registering`` while it
logs, ``registered`` once the version exists, ``failed`` with ``seqcls.error`` if it could not: :func:`mark_failed`):
the model, lineage and the version then hang off the same run (``seqcls.outcome=reused`` and the version number when
that configuration was registered before: :func:`mark_reused`). When validate logged nothing (skipped, or MLflow
unavailable where it ran), register opens its own run with the same contents (:func:`open_run`).

:func:`log_parity_evidence` never raises: the gate's outcome is the step's outcome, and a failed
gate's :class:`~seqcls.errors.GateError` must not be replaced by an MLflow error.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import fields
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from seqcls.errors import ResourceError
from seqcls.files import out_of_space, resource_error
from seqcls.gates.metrics import Scores
from seqcls.gates.rules import OVERALL
from seqcls.registry.ledger import RELEASE_KEY_TAG, client, experiment
from seqcls.release.keys import RULE_PARAMS, release_key
from seqcls.release.records import EVALUATION, OUT_DIRS, PARITY_REPORT, ParityReport
from seqcls.release.workspace import Release

log = logging.getLogger(__name__)

VALIDATE_STEP = "validate"
EVALUATE_STEP = "evaluate"
PARITY_TAG = "seqcls.gates.parity"
QUALITY_TAG = "seqcls.gates"
QUALITY_FAILED = "quality_failed"
OUTCOME_TAG = "seqcls.outcome"
GATE_ERROR_TAG = "seqcls.gate_error"
RUN_ID_KEY = "mlflow_run_id"  # in the manifest's validate record
VALIDATED, GATE_FAILED, REGISTERED, REUSED = "validated", "gate_failed", "registered", "reused"
REGISTERING, FAILED = "registering", "failed"  # register took the run / the registration failed
ERROR_TAG = "seqcls.error"
OUTCOMES = ("passed", "failed", "overridden")
#: ``seqcls.override.<gate>``: the reason a gate's refusal was overridden (on the run and the model version).
OVERRIDE_TAG = "seqcls.override.{gate}"


def run_params(release: Release, report: ParityReport) -> dict[str, Any]:
    """What the MLflow run records as params: the release's inputs, one value each."""
    cfg, ckpt = release.config, release.checkpoint
    return {
        "checkpoint": str(ckpt.origin),
        "fingerprint": ckpt.fingerprint,
        "opset": cfg.opset,
        "max_length": cfg.max_length,
        "threshold": cfg.threshold,
        "thresholds": json.dumps(cfg.thresholds, ensure_ascii=False),
        "hierarchy": cfg.hierarchy,
        "atol": cfg.atol,
        "rtol": cfg.rtol,
        "prob_atol": cfg.prob_atol,
        "profile": cfg.profile,  # as configured ("auto" included): the release's identity
        "profile_chosen": report.profile,  # what was served and gated (auto: convert's choice)
        **{f"serving.{k}": v for k, v in release.serving.to_dict().items() if k != "profile"},
        "provider": report.provider,
        "num_labels": ckpt.num_labels,
        **{f"rule.{k}": getattr(cfg, k) for k in RULE_PARAMS},  # the effective rules the verdicts judged by
        "override": cfg.override,
    }


def open_run(c, release: Release, report: ParityReport | None, key: str, *, parity: str, outcome: str, **tags) -> str:
    """A new run of this release (tags, params, the report's metrics); returns its id."""
    from mlflow.entities import Metric, Param

    ws, cfg, ckpt = release.workspace, release.config, release.checkpoint
    run = c.create_run(
        experiment(c, release.settings, cfg.model_name),
        run_name=f"{cfg.model_name}-{ckpt.short_fingerprint}-{key[:8]}",
        tags={
            "fingerprint": ckpt.fingerprint,
            RELEASE_KEY_TAG: key,
            "seqcls.release.workspace": str(ws.root),
            PARITY_TAG: parity,
            OUTCOME_TAG: outcome,
            **tags,
        },
    )
    run_id = run.info.run_id
    params = {**(run_params(release, report) if report else {}), RELEASE_KEY_TAG: key}
    metrics, now = (report.metrics() if report else {}), int(time.time() * 1000)
    c.log_batch(
        run_id,
        metrics=[Metric(name, value, now, 0) for name, value in metrics.items()],
        params=[Param(name, str(value)[:6000]) for name, value in params.items()],
    )
    return run_id


def _report(directory: Path) -> ParityReport | None:
    path = directory / Path(PARITY_REPORT).name
    if not path.is_file():  # the gate failed before it wrote one (e.g. require_gpu without a GPU)
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return ParityReport(**{f.name: data[f.name] for f in fields(ParityReport) if f.name in data})


def _override_tags(release: Release, step: str) -> dict[str, str]:
    override = ((release.workspace.step(step) or {}).get("summary") or {}).get("override")
    return {OVERRIDE_TAG.format(gate=override["gate"]): override["reason"][:5000]} if override else {}


def _log_evidence(release: Release, outcome: str) -> str:
    ws = release.workspace
    passed = outcome != "failed"
    directory = ws.path(OUT_DIRS[VALIDATE_STEP]) if passed else ws.failed_dir(VALIDATE_STEP)
    error = (ws.step(VALIDATE_STEP) or {}).get("error", "") if not passed else ""
    c = client(release.settings)
    run_id = open_run(
        c,
        release,
        _report(directory),
        release_key(release),
        parity=outcome,
        outcome=VALIDATED if passed else GATE_FAILED,
        **({GATE_ERROR_TAG: error[:5000]} if error else {}),
        **_override_tags(release, VALIDATE_STEP),
    )
    if directory.is_dir() and any(directory.iterdir()):
        c.log_artifacts(run_id, str(directory), "parity")
    c.set_terminated(run_id, "FINISHED" if passed else "FAILED")
    return run_id


def log_parity_evidence(release: Release, outcome: str) -> str | None:
    """Log the gate's report and plot to a new MLflow run tagged ``seqcls.gates.parity=<outcome>``.

    Call it after validate's ``run_step`` returned a fresh result (``outcome="passed"``: files in
    ``parity/``) or raised :class:`~seqcls.errors.GateError` (``"failed"``: files in
    ``failed/validate/``, the error in the step record). Records the run id in the validate
    record and returns it; None (with a warning) when MLflow could not take it.
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r}; expected one of {OUTCOMES}")
    try:
        run_id = _log_evidence(release, outcome)
    except Exception as exc:  # no mlflow in this interpreter, MLflow down, a bad release key...
        log.warning("validate: parity evidence not logged to MLflow (%s: %s)", type(exc).__name__, exc)
        return None
    release.workspace.mark(VALIDATE_STEP, **{RUN_ID_KEY: run_id})
    log.info("validate: parity evidence (%s) logged to MLflow run %s", outcome, run_id)
    return run_id


def adopt_run(c, validate_record: dict[str, Any], key: str) -> str | None:
    """The run validate opened for this gate, if no registration took it yet and it is for ``key``."""
    from mlflow.exceptions import MlflowException

    run_id = validate_record.get(RUN_ID_KEY)
    if not run_id:
        return None
    try:
        run = c.get_run(run_id)
    except MlflowException as exc:  # deleted, or another tracking server: register opens its own
        log.info("register: validate's run %s is not available (%s); opening a new one", run_id, exc)
        return None
    tags = run.data.tags
    if run.info.lifecycle_stage != "active" or tags.get(OUTCOME_TAG) != VALIDATED or tags.get(RELEASE_KEY_TAG) != key:
        return None
    return run_id


def mark_reused(c, validate_record: dict[str, Any], key: str, version: int) -> None:
    """A gate whose serving configuration was registered already: its run names the version that stands for it."""
    run_id = adopt_run(c, validate_record, key)
    if run_id:
        c.set_tag(run_id, OUTCOME_TAG, REUSED)
        c.set_tag(run_id, "seqcls.registered_version", str(version))


def mark_failed(c, run_id: str, exc: BaseException) -> Path | str:
    """Tag a registration's run ``failed`` with the error (never raises: MLflow may be why it failed);
    returns where its artifacts go (a local path when the store is a directory), for the error message."""
    where: Path | str = run_id
    try:
        artifact_uri = c.get_run(run_id).info.artifact_uri
        where = Path(unquote(urlparse(artifact_uri).path)) if artifact_uri.startswith("file:") else artifact_uri
        c.set_tag(run_id, OUTCOME_TAG, FAILED)
        c.set_tag(run_id, ERROR_TAG, f"{type(exc).__name__}: {exc}"[:5000])
        c.set_terminated(run_id, "FAILED" if isinstance(exc, Exception) else "KILLED")
    except Exception as tag_exc:
        log.warning("register: could not tag MLflow run %s failed (%s)", run_id, tag_exc)
    return where


def out_of_space_error(where: Path | str, exc: BaseException, run_id: str) -> ResourceError | None:
    """The ResourceError for a full disk while logging run ``run_id`` (None: ``exc`` is not one).

    A local store: the file that could not be written (else the run's artifact directory) and the
    free space there. A tracking server's store reports it in a 5xx body: its URI, no free space.
    """
    what = f"logging the release to MLflow run {run_id}"
    if out_of_space(exc):
        cause: BaseException | None = exc
        while cause is not None and not (isinstance(cause, OSError) and cause.filename):
            cause = cause.__cause__ or cause.__context__
        return resource_error(Path(cause.filename) if cause is not None else Path(where), exc, what)
    if "No space left on device" in str(exc):
        return ResourceError(f"{where}: {what} failed — MLflow's artifact store is full ({exc}). Free space there.")
    return None


def _quality_metrics(evaluation: dict[str, Any]) -> dict[str, float]:
    """``eval.<metric>`` for the candidate, ``eval.champion.<metric>`` / ``eval.fp32.<metric>`` beside it
    (the names of :meth:`~seqcls.gates.metrics.Scores.headline`)."""
    out: dict[str, float] = {"eval.passed": float(bool(evaluation.get("passed")))}
    for who, prefix in (("candidate", "eval."), ("champion", "eval.champion."), ("fp32", "eval.fp32.")):
        if evaluation.get(who):
            figures = Scores(**evaluation[who]).headline()
            if who != "candidate":  # beside the candidate's: the figures the rules compare (evaluation.json has all)
                figures = {k: v for k, v in figures.items() if k in OVERALL or k.startswith("level_")}
            out.update({prefix + k: v for k, v in figures.items()})
    if isinstance(evaluation.get("champion_disagreements"), int):
        out["eval.champion_disagreements"] = float(evaluation["champion_disagreements"])
    return out


def _log_quality(release: Release, outcome: str) -> str:
    from mlflow.entities import Metric

    ws = release.workspace
    directory = ws.failed_dir(EVALUATE_STEP) if outcome == "failed" else ws.path(OUT_DIRS[EVALUATE_STEP])
    c = client(release.settings)
    run_id = adopt_run(c, ws.step(VALIDATE_STEP) or {}, release_key(release))
    if run_id is None:  # validate's run is gone, or an earlier refusal closed it: a new run with the parity evidence
        run_id = _log_evidence(release, "passed")
        ws.mark(VALIDATE_STEP, **{RUN_ID_KEY: run_id})
    path = directory / Path(EVALUATION).name
    evaluation = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    now = int(time.time() * 1000)
    c.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in _quality_metrics(evaluation).items()])
    c.set_tag(run_id, QUALITY_TAG, outcome)
    for tag, value in _override_tags(release, EVALUATE_STEP).items():
        c.set_tag(run_id, tag, value)
    if directory.is_dir() and any(directory.iterdir()):
        c.log_artifacts(run_id, str(directory), "quality")
    if outcome == "failed":
        error = (ws.step(EVALUATE_STEP) or {}).get("error", "")
        c.set_tag(run_id, OUTCOME_TAG, QUALITY_FAILED)
        c.set_tag(run_id, GATE_ERROR_TAG, error[:5000])
        c.set_terminated(run_id, "FAILED")
    return run_id


def log_quality_evidence(release: Release, outcome: str) -> str | None:
    """Log the quality gate's evaluation, bad cases and plot to the release's run, tagged ``seqcls.gates``.

    The run is validate's (register adopts it, so the model version carries both gates' evidence),
    else a new one with the parity evidence too. ``outcome``: ``passed``, ``skipped`` (no eval set) or
    ``failed`` (the run then ends FAILED with ``seqcls.outcome=quality_failed``: nothing adopts it).
    Never raises (the gate's verdict is the step's outcome); records the run id in the evaluate record.
    """
    if outcome not in (*OUTCOMES, "skipped"):
        raise ValueError(f"outcome {outcome!r}; expected passed, failed, overridden or skipped")
    try:
        run_id = _log_quality(release, outcome)
    except Exception as exc:  # no mlflow here, MLflow down: the evidence stays in the workspace
        log.warning("evaluate: quality evidence not logged to MLflow (%s: %s)", type(exc).__name__, exc)
        return None
    release.workspace.mark(EVALUATE_STEP, **{RUN_ID_KEY: run_id})
    log.info("evaluate: quality evidence (%s) logged to MLflow run %s", outcome, run_id)
    return run_id
