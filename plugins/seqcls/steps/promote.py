"""Step 9 — promote: MLflow alias ``champion`` → this release's version, once it is what is served.

The registry mirrors the recorded serving state, never leads it: promote refuses unless the
state says this release's Triton version is served (``expose`` ran). The version it replaces
becomes ``previous-champion``; every move is appended to the registered model's
``champion_history`` tag. The version promoted is the one registered for this release's
:func:`~seqcls.release.keys.release_key` (its serving configuration), never another version of the
same checkpoint. Safe to repeat. It ends the release: the lease is given back.
If MLflow is down here, the smoke-tested version keeps serving; a re-run (or ``seqcls sync``)
moves the alias.
"""

from __future__ import annotations

import json
from pathlib import Path

from seqcls.errors import StepOrderError
from seqcls.registry.ledger import CHAMPION, PREVIOUS, model_version_url, set_champion, version_label
from seqcls.release import control
from seqcls.release.keys import release_key
from seqcls.release.records import OUT_DIRS, Published, Registered
from seqcls.release.workspace import Release, StepResult
from seqcls.serving.state import append_event, current_state
from seqcls.steps import require

STEP = "promote"
OUT_DIR = OUT_DIRS[STEP]


def promote(release: Release) -> StepResult:
    """Move ``champion`` to this release's version (after it was exposed)."""
    ws, cfg = release.workspace, release.config
    require(release, STEP)
    registered, key = Registered.load(ws), release_key(release)
    if registered.release_key != key:
        raise StepOrderError(
            f"{cfg.model_name}: register recorded version {registered.version} for serving configuration "
            f"{registered.release_key or '(none: registered before release keys)'}, but this release's is {key}; "
            "run `seqcls register` with these parameters first."
        )
    version = registered.version
    triton_version = Published.load(ws).version
    repository = Path(str(release.settings.triton_repository))
    inputs = {"version": version, "model_name": cfg.model_name, "triton_version": triton_version, "release_key": key}

    def body(out: Path) -> tuple[dict, str]:
        state = current_state(repository, cfg.model_name)
        if state.serving != triton_version:
            raise StepOrderError(
                f"{cfg.model_name}: the recorded state serves Triton v{state.serving}, not this release's "
                f"Triton v{triton_version}; the champion follows what is served — run `seqcls expose` first."
            )
        moved = set_champion(release.settings, cfg.model_name, version, triton_version)
        if not moved["already"]:  # the serving log (`seqcls history`) shows the champion moves too
            append_event(
                repository,
                cfg.model_name,
                "promote",
                version=triton_version,
                fingerprint=release.checkpoint.fingerprint,
                mlflow=version,
                mlflow_previous=moved["previous"],
                by=control.release_owner(release),
            )
        control.give_lease(repository, cfg.model_name, control.release_owner(release))
        summary = {
            "model_name": cfg.model_name,
            "version": version,
            "previous": moved["previous"],
            "already": moved["already"],
            "triton_version": triton_version,
            "release_key": key,
            "url": model_version_url(release.settings, cfg.model_name, version),
        }
        (out / "promote.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        this = version_label(triton_version, version)
        if moved["already"]:
            return summary, f"{cfg.model_name} {this} is already {CHAMPION}"
        return summary, (
            f"{CHAMPION} → {cfg.model_name} {this}; "
            + (
                f"{PREVIOUS} → MLflow v{summary['previous']}"
                if summary["previous"] is not None
                else f"no {PREVIOUS} (first champion)"
            )
        )

    return ws.run_step(STEP, inputs, body, out_dir=OUT_DIR, always_run=True)
