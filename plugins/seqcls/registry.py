"""Step 4 — register, and later promote: the MLflow model registry as the release ledger.

MLflow answers "what is live, where did it come from, what do we roll back to":

- ``register``: one run per release attempt in experiment ``seqcls-<model>`` (params, every
  parity figure as a metric, artifacts: the ONNX model through MLflow's ONNX flavor, the static
  Paddle model, tokenizer and label files, parity report + plot), then a model version tagged
  with lineage (fingerprint, library versions, opset, profile) and alias ``candidate``.
  Idempotent per fingerprint: Airflow retries and re-runs return the existing version.
- ``promote``: alias ``champion`` → this version, the one it replaced kept as
  ``previous-champion``, every move appended to the registered model's ``champion_history`` tag.
- ``undo``: what a rollback calls. Champion moves back if this release had been promoted; an
  alias ``candidate`` this release set is restored; a version this release created (and that
  never became champion) is deleted again — the registry ends exactly as it was, while the
  MLflow *run* stays (tagged ``seqcls.outcome=rolled_back``) as the audit trail.

Aliases and tags, not the deprecated stages. Where MLflow is: see :mod:`seqcls.settings`.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls.errors import RegistryError, StepOrderError
from seqcls.settings import Settings
from seqcls.workspace import Release, StepResult, package_versions

log = logging.getLogger(__name__)

REGISTER_STEP = "register"
PROMOTE_STEP = "promote"
CANDIDATE = "candidate"
CHAMPION = "champion"
PREVIOUS = "previous-champion"
HISTORY_TAG = "champion_history"
HISTORY_KEEP = 20


def tracking_uri(settings: Settings) -> str:
    uri = str(settings.mlflow_tracking_uri)
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    if uri.startswith("file:") or (uri.startswith("/") and not uri.startswith("sqlite")):
        raise RegistryError(
            f"MLflow tracking URI {uri!r} is a file store (in maintenance mode, no model registry features we "
            "rely on); use sqlite:///path/mlflow.db or an http(s):// MLflow server."
        )
    return uri


def client(settings: Settings):
    """An ``MlflowClient`` for the settings' tracking + registry URI (imports mlflow lazily)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(settings)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _experiment(c, settings: Settings, model_name: str) -> str:
    name = f"seqcls-{model_name}"
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if str(settings.mlflow_tracking_uri).startswith("sqlite:"):
        artifacts = settings.mlflow_artifacts_dir / name
        artifacts.mkdir(parents=True, exist_ok=True)
        location = artifacts.as_uri()
    return c.create_experiment(name, artifact_location=location, tags={"seqcls.model_name": model_name})


def _alias(c, name: str, alias: str):
    from mlflow.exceptions import MlflowException

    try:
        return c.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def find_version(c, name: str, fingerprint: str):
    """The model version registered for ``fingerprint`` (newest if several), or None."""
    from mlflow.exceptions import MlflowException

    try:
        found = c.search_model_versions(f"name = '{name}' and tags.fingerprint = '{fingerprint}'")
    except MlflowException:
        found = [v for v in c.search_model_versions(f"name = '{name}'") if v.tags.get("fingerprint") == fingerprint]
    return max(found, key=lambda v: int(v.version)) if found else None


def alias_version(settings: Settings, model_name: str, alias: str) -> int | None:
    """The version an alias points to (None when unset or the model is not registered)."""
    mv = _alias(client(settings), model_name, alias)
    return int(mv.version) if mv is not None else None


def champion_fingerprint(settings: Settings, model_name: str) -> str | None:
    """Fingerprint of the version the ``champion`` alias points to (None: no champion yet)."""
    c = client(settings)
    mv = _alias(c, model_name, CHAMPION)
    return mv.tags.get("fingerprint") if mv is not None else None


def model_version_url(settings: Settings, model_name: str, version: int | str) -> str | None:
    """Where an MLflow UI shows this version (only for an http(s) tracking server)."""
    uri = str(settings.mlflow_tracking_uri)
    if not uri.startswith(("http://", "https://")):
        return None
    return f"{uri.rstrip('/')}/#/models/{model_name}/versions/{version}"


def _metrics(report: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for section in ("numeric", "decisions", "tokenizer"):
        for key, value in report.get(section, {}).items():
            if isinstance(value, int | float):  # bools included: passed → 1.0
                out[f"{section}.{key}"] = float(value)
    out["texts"] = float(report.get("texts", 0))
    return out


def register(release: Release) -> StepResult:
    """Register the validated release (or return the version already registered for it)."""
    ws, cfg, ckpt = release.workspace, release.config, release.checkpoint
    validate_rec = ws.require("validate")
    convert_rec = ws.require("convert")
    inputs = {
        "validate_outputs": validate_rec["outputs"],
        "tracking_uri": str(release.settings.mlflow_tracking_uri),
        "model_name": cfg.model_name,
    }

    def body(out: Path) -> tuple[dict, str]:
        import mlflow
        import onnx

        c = client(release.settings)
        existing = find_version(c, cfg.model_name, ckpt.fingerprint)
        if existing is not None:
            summary = {
                "model_name": cfg.model_name,
                "version": int(existing.version),
                "run_id": existing.run_id,
                "created": False,
                "created_registered_model": False,
                "previous_candidate": None,
            }
            (out / "registry.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
            return (
                summary,
                f"{cfg.model_name} version {existing.version} already holds fingerprint "
                f"{ckpt.short_fingerprint} — reused",
            )
        t0 = time.perf_counter()
        report = json.loads(ws.path("parity/report.json").read_text(encoding="utf-8"))
        versions = package_versions()
        exp_id = _experiment(c, release.settings, cfg.model_name)
        run = c.create_run(
            exp_id,
            run_name=f"{cfg.model_name}-{ckpt.short_fingerprint}",
            tags={"fingerprint": ckpt.fingerprint, "seqcls.workspace": str(ws.root), "seqcls.outcome": "registered"},
        )
        run_id = run.info.run_id
        params = {
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
            "provider": report.get("provider"),
            "num_labels": ckpt.num_labels,
        }
        for key, value in params.items():
            c.log_param(run_id, key, str(value)[:6000])
        for key, value in _metrics(report).items():
            c.log_metric(run_id, key, value)
        onnx_path = ws.path(convert_rec["summary"].get("model_file", "onnx/model.onnx"))
        from seqcls.validate import served_onnx

        served = served_onnx(release)
        with mlflow.start_run(run_id=run_id):
            info = mlflow.onnx.log_model(
                onnx.load(str(served)),
                name="onnx",
                pip_requirements=[f"onnx=={versions['onnx']}", f"onnxruntime=={versions['onnxruntime']}"],
            )
        c.log_artifacts(run_id, str(ws.path("static")), "paddle_static")
        c.log_artifacts(run_id, str(ws.path("parity")), "parity")
        for f in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "config.json"):
            if (ckpt.path / f).is_file():
                c.log_artifact(run_id, str(ckpt.path / f), "tokenizer" if f != "config.json" else "checkpoint")
        c.log_artifact(run_id, str(ckpt.label_file), "checkpoint")
        if onnx_path != served:
            c.log_artifact(run_id, str(onnx_path), "onnx_fp32")
        c.set_terminated(run_id)

        created_rm = False
        from mlflow.exceptions import MlflowException

        try:
            c.get_registered_model(cfg.model_name)
        except MlflowException:
            c.create_registered_model(
                cfg.model_name,
                tags={"seqcls": "true"},
                description="PaddleNLP ERNIE sequence classifier released by seqcls",
            )
            created_rm = True
        lineage = {
            "fingerprint": ckpt.fingerprint,
            "opset": str(cfg.opset),
            "profile": cfg.profile,
            "seqcls_version": str(versions.get("seqcls")),
            "num_labels": str(ckpt.num_labels),
            "checkpoint": str(ckpt.path),
            "parity.logits_max_abs_diff": str(report.get("numeric", {}).get("logits_max_abs_diff")),
            "parity.decision_agreement": str(report.get("decisions", {}).get("agreement")),
        }
        lineage.update({f"version.{k}": str(v) for k, v in versions.items() if k != "seqcls"})
        mv = c.create_model_version(
            cfg.model_name,
            source=info.model_uri,
            run_id=run_id,
            tags=lineage,
            description=f"fingerprint {ckpt.fingerprint}",
            model_id=info.model_id,
        )
        prev_candidate = _alias(c, cfg.model_name, CANDIDATE)
        c.set_registered_model_alias(cfg.model_name, CANDIDATE, mv.version)
        seconds = time.perf_counter() - t0
        summary = {
            "model_name": cfg.model_name,
            "version": int(mv.version),
            "run_id": run_id,
            "model_uri": f"models:/{cfg.model_name}/{mv.version}",
            "logged_model": info.model_uri,
            "created": True,
            "created_registered_model": created_rm,
            "previous_candidate": int(prev_candidate.version) if prev_candidate else None,
            "seconds": round(seconds, 3),
        }
        (out / "registry.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        return summary, (
            f"registered {cfg.model_name} version {mv.version} (run {run_id[:8]}, alias {CANDIDATE}) in {seconds:.1f}s"
        )

    return ws.run_step(REGISTER_STEP, inputs, body, out_dir="registry", always_run=True)


def registered_version(release: Release) -> int:
    rec = release.workspace.require(REGISTER_STEP, hint="`seqcls register`")
    return int(rec["summary"]["version"])


def _history(c, name: str) -> list[dict[str, Any]]:
    rm = c.get_registered_model(name)
    try:
        return json.loads(rm.tags.get(HISTORY_TAG, "[]"))
    except ValueError:
        return []


def _append_history(c, name: str, entry: dict[str, Any]) -> None:
    history = [*_history(c, name), entry][-HISTORY_KEEP:]
    c.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history))


def promote(release: Release) -> StepResult:
    """Move ``champion`` to this release's version (after a passed smoke test)."""
    ws, cfg = release.workspace, release.config
    ws.require("smoke")
    version = registered_version(release)
    triton_version = ws.require("publish")["summary"]["version"]
    inputs = {"version": version, "model_name": cfg.model_name, "triton_version": triton_version}

    def body(out: Path) -> tuple[dict, str]:
        c = client(release.settings)
        current = _alias(c, cfg.model_name, CHAMPION)
        c.set_model_version_tag(cfg.model_name, str(version), "triton_version", str(triton_version))
        if current is not None and int(current.version) == version:
            summary = {"model_name": cfg.model_name, "version": version, "previous": None, "already": True}
            (out / "promote.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
            return summary, f"{cfg.model_name} version {version} is already {CHAMPION}"
        if current is not None:
            c.set_registered_model_alias(cfg.model_name, PREVIOUS, current.version)
        c.set_registered_model_alias(cfg.model_name, CHAMPION, str(version))
        c.set_model_version_tag(
            cfg.model_name, str(version), "champion_since", datetime.now(UTC).isoformat(timespec="seconds")
        )
        _append_history(
            c,
            cfg.model_name,
            {
                "champion": version,
                "replaced": int(current.version) if current else None,
                "at": datetime.now(UTC).isoformat(timespec="seconds"),
                "triton_version": triton_version,
            },
        )
        summary = {
            "model_name": cfg.model_name,
            "version": version,
            "previous": int(current.version) if current else None,
            "already": False,
            "triton_version": triton_version,
            "url": model_version_url(release.settings, cfg.model_name, version),
        }
        (out / "promote.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        return summary, (
            f"{CHAMPION} → {cfg.model_name} version {version} (Triton version {triton_version}); "
            f"{PREVIOUS} → {summary['previous']}"
        )

    return ws.run_step(PROMOTE_STEP, inputs, body, out_dir="promote", always_run=True)


def undo(release: Release, *, reason: str = "") -> dict[str, Any]:
    """Leave the registry as it was before this release (see module doc); safe to repeat."""
    ws, cfg = release.workspace, release.config
    rec = ws.step(REGISTER_STEP)
    if not rec or rec.get("status") != "ok" or rec["summary"].get("undone"):
        return {"changed": False, "why": "nothing registered by this release"}
    summary = rec["summary"]
    version = int(summary["version"])
    c = client(release.settings)
    actions: list[str] = []
    champion = _alias(c, cfg.model_name, CHAMPION)
    if champion is not None and int(champion.version) == version:
        previous = _alias(c, cfg.model_name, PREVIOUS)
        if previous is not None:
            c.set_registered_model_alias(cfg.model_name, CHAMPION, previous.version)
            actions.append(f"{CHAMPION} back to version {previous.version}")
            older = [h for h in _history(c, cfg.model_name) if h.get("champion") == int(previous.version)]
            replaced = older[-1].get("replaced") if older else None
            if replaced:
                c.set_registered_model_alias(cfg.model_name, PREVIOUS, str(replaced))
            else:
                c.delete_registered_model_alias(cfg.model_name, PREVIOUS)
        else:
            c.delete_registered_model_alias(cfg.model_name, CHAMPION)
            actions.append(f"{CHAMPION} removed (no previous champion)")
        _append_history(
            c,
            cfg.model_name,
            {
                "champion": int(previous.version) if previous else None,
                "replaced": version,
                "rollback": True,
                "reason": reason[:200],
                "at": datetime.now(UTC).isoformat(timespec="seconds"),
            },
        )
    candidate = _alias(c, cfg.model_name, CANDIDATE)
    if summary.get("created") and candidate is not None and int(candidate.version) == version:
        if summary.get("previous_candidate"):
            c.set_registered_model_alias(cfg.model_name, CANDIDATE, str(summary["previous_candidate"]))
            actions.append(f"{CANDIDATE} back to version {summary['previous_candidate']}")
        else:
            c.delete_registered_model_alias(cfg.model_name, CANDIDATE)
            actions.append(f"{CANDIDATE} removed")
    was_champion = any(h.get("champion") == version for h in _history(c, cfg.model_name))
    if summary.get("created") and not was_champion:
        c.delete_model_version(cfg.model_name, str(version))
        actions.append(f"version {version} deleted (created by this release, never champion)")
        if summary.get("created_registered_model") and not c.search_model_versions(f"name = '{cfg.model_name}'"):
            c.delete_registered_model(cfg.model_name)
            actions.append(f"registered model {cfg.model_name} deleted (created by this release)")
    else:
        c.set_model_version_tag(cfg.model_name, str(version), "seqcls.rolled_back", reason[:500] or "true")
    if summary.get("run_id"):
        try:
            c.set_tag(summary["run_id"], "seqcls.outcome", "rolled_back")
        except Exception as exc:  # the run is audit trail only; never block a rollback on it
            log.warning("registry: could not tag run %s: %s", summary["run_id"], exc)
    ws.mark(REGISTER_STEP, summary={**summary, "undone": True, "undo_actions": actions})
    log.info("registry: undone for %s version %d — %s", cfg.model_name, version, "; ".join(actions) or "no change")
    return {"changed": bool(actions), "actions": actions, "version": version}


def require_registered(release: Release) -> None:
    try:
        registered_version(release)
    except StepOrderError as exc:
        raise RegistryError(str(exc)) from exc
