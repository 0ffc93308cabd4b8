"""Step 4 — register: the validated release as an MLflow model version with lineage, alias ``candidate``.

One run per release attempt in experiment ``seqcls-<model>`` (params, every parity figure as a
metric, artifacts: the ONNX model through MLflow's ONNX flavor, the static Paddle model,
tokenizer and label files, parity report + plot), then a model version tagged with lineage and
alias ``candidate``. Idempotent per fingerprint: Airflow retries and re-runs return the
existing version. MLflow access shared with promote/rollback lives in :mod:`seqcls.registry`.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from seqcls.records import OUT_DIRS, ParityReport, Registered, fp32_onnx, served_onnx, static_dir
from seqcls.registry import CANDIDATE, _alias, _experiment, client, find_version
from seqcls.steps import require
from seqcls.workspace import Release, StepResult, package_versions

log = logging.getLogger(__name__)

STEP = "register"
OUT_DIR = OUT_DIRS[STEP]
TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


def run_params(release: Release, report: ParityReport) -> dict[str, Any]:
    """What the MLflow run records as params: the release's inputs, one value each."""
    cfg, ckpt = release.config, release.checkpoint
    return {
        "checkpoint": str(ckpt.path),
        "fingerprint": ckpt.fingerprint,
        "opset": cfg.opset,
        "max_length": cfg.max_length,
        "threshold": cfg.threshold,
        "thresholds": json.dumps(cfg.thresholds, ensure_ascii=False),
        "hierarchy": cfg.hierarchy,
        "atol": cfg.atol,
        "rtol": cfg.rtol,
        "prob_atol": cfg.prob_atol,
        "profile": cfg.profile,
        "runtime": release.settings.runtime,
        "provider": report.provider,
        "num_labels": ckpt.num_labels,
    }


def lineage_tags(release: Release, report: ParityReport, versions: dict[str, str | None]) -> dict[str, str]:
    """Model-version tags that answer "where did this come from" without opening the run."""
    cfg, ckpt = release.config, release.checkpoint
    tags = {
        "fingerprint": ckpt.fingerprint,
        "opset": str(cfg.opset),
        "profile": cfg.profile,
        "seqcls_version": str(versions.get("seqcls")),
        "num_labels": str(ckpt.num_labels),
        "checkpoint": str(ckpt.path),
        "parity.logits_max_abs_diff": str(report.numeric.get("logits_max_abs_diff")),
        "parity.decision_agreement": str(report.decisions.get("agreement")),
    }
    tags.update({f"version.{k}": str(v) for k, v in versions.items() if k != "seqcls"})
    return tags


def log_run(c, release: Release, report: ParityReport, versions: dict[str, str | None]):
    """Create the run, log params/metrics/artifacts and the served ONNX model; returns (run_id, info)."""
    import mlflow
    import onnx

    ws, cfg, ckpt = release.workspace, release.config, release.checkpoint
    run = c.create_run(
        _experiment(c, release.settings, cfg.model_name),
        run_name=f"{cfg.model_name}-{ckpt.short_fingerprint}",
        tags={"fingerprint": ckpt.fingerprint, "seqcls.workspace": str(ws.root), "seqcls.outcome": "registered"},
    )
    run_id = run.info.run_id
    for key, value in run_params(release, report).items():
        c.log_param(run_id, key, str(value)[:6000])
    for key, value in report.metrics().items():
        c.log_metric(run_id, key, value)
    served = served_onnx(ws)
    with mlflow.start_run(run_id=run_id):
        info = mlflow.onnx.log_model(
            onnx.load(str(served)),
            name="onnx",
            pip_requirements=[f"onnx=={versions['onnx']}", f"onnxruntime=={versions['onnxruntime']}"],
        )
    c.log_artifacts(run_id, str(static_dir(ws)), "paddle_static")
    c.log_artifacts(run_id, str(ws.path(OUT_DIRS["validate"])), "parity")
    for name in TOKENIZER_FILES:
        if (ckpt.path / name).is_file():
            c.log_artifact(run_id, str(ckpt.path / name), "tokenizer")
    for path in (ckpt.path / "config.json", ckpt.label_file):
        c.log_artifact(run_id, str(path), "checkpoint")
    if fp32_onnx(ws) != served:
        c.log_artifact(run_id, str(fp32_onnx(ws)), "onnx_fp32")
    c.set_terminated(run_id)
    return run_id, info


def ensure_registered_model(c, name: str) -> bool:
    """Create the registered model if missing; True when this call created it."""
    from mlflow.exceptions import MlflowException

    try:
        c.get_registered_model(name)
        return False
    except MlflowException:
        c.create_registered_model(
            name, tags={"seqcls": "true"}, description="PaddleNLP ERNIE sequence classifier released by seqcls"
        )
        return True


def register_new(release: Release) -> Registered:
    """Log the run, create the model version with lineage, point ``candidate`` at it."""
    cfg, ckpt = release.config, release.checkpoint
    c = client(release.settings)
    t0 = time.perf_counter()
    report = ParityReport.load(release.workspace)
    versions = package_versions()
    run_id, info = log_run(c, release, report, versions)
    created_rm = ensure_registered_model(c, cfg.model_name)
    mv = c.create_model_version(
        cfg.model_name,
        source=info.model_uri,
        run_id=run_id,
        tags=lineage_tags(release, report, versions),
        description=f"fingerprint {ckpt.fingerprint}",
        model_id=info.model_id,
    )
    prev_candidate = _alias(c, cfg.model_name, CANDIDATE)
    c.set_registered_model_alias(cfg.model_name, CANDIDATE, mv.version)
    return Registered(
        model_name=cfg.model_name,
        version=int(mv.version),
        run_id=run_id,
        created=True,
        created_registered_model=created_rm,
        previous_candidate=int(prev_candidate.version) if prev_candidate else None,
        model_uri=f"models:/{cfg.model_name}/{mv.version}",
        logged_model=info.model_uri,
        seconds=round(time.perf_counter() - t0, 3),
    )


def register(release: Release) -> StepResult:
    """Register the validated release (or return the version already registered for it)."""
    cfg, ckpt = release.config, release.checkpoint
    records = require(release, STEP)
    inputs = {
        "validate_outputs": records["validate"]["outputs"],
        "tracking_uri": str(release.settings.mlflow_tracking_uri),
        "model_name": cfg.model_name,
    }

    def body(out: Path) -> tuple[dict, str]:
        existing = find_version(client(release.settings), cfg.model_name, ckpt.fingerprint)
        if existing is not None:
            reg = Registered(cfg.model_name, int(existing.version), existing.run_id)
            msg = f"{cfg.model_name} version {reg.version} already holds fingerprint {ckpt.short_fingerprint} — reused"
        else:
            reg = register_new(release)
            msg = (
                f"registered {cfg.model_name} version {reg.version} (run {str(reg.run_id)[:8]}, alias {CANDIDATE}) "
                f"in {reg.seconds:.1f}s"
            )
        (out / "registry.json").write_text(json.dumps(reg.to_dict(), indent=1), encoding="utf-8")
        return reg.to_dict(), msg

    return release.workspace.run_step(STEP, inputs, body, out_dir=OUT_DIR, always_run=True)
