"""Step 8 — expose: the smoke-tested candidate becomes what the ensemble serves, on every endpoint.

Under the release lease the recorded state moves (``serving = N``, the old served version kept
warm as ``previous``, no candidate), then every endpoint is reconciled: the public ensemble
switches to N (Triton keeps the old version answering until N is ready, so no request fails),
the candidate route is unloaded. Only a candidate that passed smoke can be exposed.

If an endpoint dies mid-switch the recorded state already says N: the step fails naming the
endpoint, and ``seqcls sync`` (or the ``seqcls_sync`` DAG) finishes the switch — nothing to undo.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from seqcls.errors import StepOrderError
from seqcls.release import control
from seqcls.release.records import OUT_DIRS, published_version
from seqcls.release.workspace import Release, StepResult
from seqcls.serving.client import Endpoint, endpoints_from_settings
from seqcls.serving.repository import Repository, ServingOptions
from seqcls.serving.state import ServingState
from seqcls.steps import require

log = logging.getLogger(__name__)

STEP = "expose"
OUT_DIR = OUT_DIRS[STEP]


def expose(release: Release, endpoints: Sequence[Endpoint] | None = None) -> StepResult:
    """Switch the public ensemble to the smoke-tested version N (already serving → says so)."""
    require(release, STEP)
    version = published_version(release)
    endpoints = list(endpoints or endpoints_from_settings(release.settings))
    options = ServingOptions.from_spec(release.serving)
    model, fp = release.config.model_name, release.checkpoint.fingerprint
    inputs = {"version": version, "endpoints": [e.grpc for e in endpoints]}

    def change(s: ServingState) -> ServingState:
        if s.serving == version and s.candidate is None:
            return s
        if s.candidate != version:
            raise StepOrderError(
                f"version {version} of {model!r} is not the candidate (recorded: serving {s.serving}, candidate "
                f"{s.candidate}); run `seqcls reload` and `seqcls smoke` first."
            )
        return s.promoted(version, fp, control.release_owner(release))

    def body(out: Path) -> tuple[dict, str]:
        repo = Repository.from_settings(release.settings, model)
        control.take_lease(repo.root, model, control.release_owner(release), STEP)
        before, after, report = control.transition(
            repo, model, change, endpoints, keep_previous=options.keep_previous_loaded
        )
        control.require_converged(report, f"exposing {model} version {version}")
        summary = {
            "version": version,
            "previous": after.previous,
            "already": before.serving == version and before.candidate is None,
            "endpoints": [e.grpc for e in endpoints],
            "actions": report.actions,
            "seconds": round(report.seconds, 3),
        }
        (out / "expose.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        if summary["already"]:
            return summary, f"{repo.names.ensemble} already serves Triton v{version} on {len(endpoints)} endpoint(s)"
        warm = f"previous Triton v{after.previous} kept warm" if after.previous is not None else "no previous version"
        return summary, (
            f"{repo.names.ensemble} serves Triton v{version} on {len(endpoints)} endpoint(s) ({warm}) in "
            f"{report.seconds:.1f}s"
        )

    return release.workspace.run_step(STEP, inputs, body, out_dir=OUT_DIR, always_run=True)
