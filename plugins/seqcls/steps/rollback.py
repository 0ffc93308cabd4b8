"""Rollback: after a failed reload or smoke test, serve exactly what was served before.

Restores the ``config.pbtxt`` files saved by ``reload`` before it switched (so N-1 serves again,
or nothing if nothing did), reloads them on every endpoint with readiness verified, and marks
the failed version in the manifest. Safe to repeat: when version N is not (or no longer) what the
repository serves, there is nothing to undo and it says so. With a registry configured the
``champion`` alias is moved back too (see :mod:`seqcls.registry`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from seqcls.errors import StepOrderError
from seqcls.records import OUT_DIRS, published_version
from seqcls.serving.client import Endpoint, endpoints_from_settings, ops_for
from seqcls.serving.names import MODELS
from seqcls.serving.repository import Repository
from seqcls.steps.reload import PRIOR_FILE, restore
from seqcls.workspace import Release, StepResult

log = logging.getLogger(__name__)

STEP = "rollback"
OUT_DIR = OUT_DIRS[STEP]


def _prior(release: Release) -> dict | None:
    for rel in (f"reload/{PRIOR_FILE}", f"failed/reload/{PRIOR_FILE}"):
        p = release.workspace.path(rel)
        if p.is_file():
            return json.loads(p.read_text(encoding="utf-8"))
    return None


def rollback(
    release: Release, endpoints: Sequence[Endpoint] | None = None, *, reason: str = "", registry: bool = True
) -> StepResult:
    """Undo this release on every endpoint, then in the registry; a no-op when nothing is to undo.

    Triton first: serving the old model again matters more than the ledger, and must not wait
    for (or fail with) an unreachable MLflow.
    """
    ws = release.workspace
    try:
        version = published_version(release)
    except StepOrderError:
        version = None
    endpoints = list(endpoints or endpoints_from_settings(release.settings))
    repo = Repository.from_settings(release.settings)
    inputs = {"version": version, "endpoints": [e.grpc for e in endpoints], "reason": reason}

    def body(out: Path) -> tuple[dict, str]:
        prior = _prior(release)
        with repo.lock():
            names_version = version is not None and any(version in repo.live_versions(m) for m in MODELS)
            if prior is None or not names_version:
                why = (
                    "this release never reloaded anything"
                    if prior is None
                    else f"version {version} is not live (serving {repo.serving_version()})"
                )
                summary = {"rolled_back": False, "version": version, "reason": reason, "why": why}
                (out / "rollback.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
                return summary, f"nothing to roll back: {why}"
            ops = ops_for(endpoints)
            for op in ops:
                op.require_live()
            log.warning(
                "rollback: version %s failed (%s); restoring version %s on %d endpoint(s)",
                version,
                reason or "no reason given",
                prior.get("serving_version"),
                len(ops),
            )
            result = restore(repo, ops, prior, version)
        summary = {
            "rolled_back": True,
            "version": version,
            "reason": reason,
            **result,
            "serving_version": repo.serving_version(),
        }
        (out / "rollback.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        return summary, (
            f"version {version} withdrawn; serving {summary['serving_version'] or 'nothing'} "
            f"again on {len(ops)} endpoint(s)"
        )

    result = ws.run_step(STEP, inputs, body, out_dir=OUT_DIR, always_run=True)
    if result.summary.get("rolled_back"):
        ws.mark("publish", failed_version=version, rolled_back=True, rollback_reason=reason)
    if registry:
        from seqcls.registry import undo

        registry_result = undo(release, reason=reason)
        result.summary["registry"] = registry_result
        ws.mark(STEP, registry=registry_result)
        if registry_result.get("actions"):
            result.message += "; registry: " + "; ".join(registry_result["actions"])
    return result
