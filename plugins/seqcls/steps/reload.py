"""Step 6 — reload: load version N on every Triton endpoint as the *candidate*, beside what is served.

Nothing public changes here. Under the model's release lease the recorded serving state gets
``candidate = N`` (atomically, before any endpoint is touched), then every endpoint is reconciled
to it: the composing models load N beside the served version (their configs'
``version_policy``), each verified ready per version, and the candidate route
``seqcls_candidate`` — an ensemble of its own name pinned to N — is loaded for the smoke test.
Unpinned clients of ``seqcls`` keep getting the served version until ``expose``.

Before anything live is touched, N must be complete and unmodified since publish, and its
composing models' inputs/outputs must equal the served version's: Triton's ``config.pbtxt`` is
per model (shared by its versions), so a version that changes a tensor's type cannot serve
beside the old one — that is refused here with the difference named, instead of breaking the
served ensemble mid-reload.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from seqcls.errors import ServingError
from seqcls.release import control
from seqcls.release.records import OUT_DIRS, published_version
from seqcls.release.workspace import Release, StepResult
from seqcls.serving.client import Endpoint, endpoints_from_settings
from seqcls.serving.repository import SNAPSHOT, Repository, ServingOptions, parse_config
from seqcls.serving.state import ServingState, current_state
from seqcls.steps import require

log = logging.getLogger(__name__)

STEP = "reload"
OUT_DIR = OUT_DIRS[STEP]


def check_stageable(repo: Repository, version: int, serving: int | None) -> None:
    """N is whole, untouched since publish, parses, and can serve beside the served version."""
    complete = set(repo.complete_versions())
    if version not in complete:
        raise ServingError(f"version {version} is not complete in {repo.root} (have {sorted(complete)})")
    damaged = repo.damaged_files(version)
    if damaged:
        raise ServingError(
            f"version {version} in {repo.root} was modified after publishing ({'; '.join(damaged[:5])}); "
            "publish the release again instead of editing a version in place"
        )
    for model in repo.names.models:  # nothing live is touched unless every config parses
        parse_config(repo.snapshot(model, version), f"{repo.root / model}/{version}/{SNAPSHOT}")
    if serving is None or serving == version or serving not in complete:
        return
    for model in repo.names.composing:
        old, new = repo.io_signature(model, serving), repo.io_signature(model, version)
        if old != new:
            changed = {k: (old[k], new[k]) for k in old if old[k] != new[k]}
            raise ServingError(
                f"version {version} of {model} cannot serve beside version {serving}: its {', '.join(changed)} "
                f"differ ({changed}). Triton shares one config.pbtxt between a model's versions; keep the "
                "interface, or release under another model name."
            )


def stage(release: Release, endpoints: Sequence[Endpoint], options: ServingOptions) -> tuple[dict, str]:
    """Record N as the candidate and reconcile; already serving N → make sure it is, say so."""
    repo = Repository.from_settings(release.settings, release.config.model_name)
    model, fp = release.config.model_name, release.checkpoint.fingerprint
    version = published_version(release)
    owner = control.release_owner(release)
    control.take_lease(repo.root, model, owner, STEP)
    state = current_state(repo.root, model)
    already = state.serving == version
    if not already:
        check_stageable(repo, version, state.serving)

    def change(s: ServingState) -> ServingState:
        if s.serving == version:
            return s
        if s.candidate not in (None, version):  # we hold the lease: that candidate's release is gone
            log.warning("reload: abandoning candidate %s of a release that no longer runs", s.candidate)
            s = s.without_candidate(owner, "abandoned: its release no longer holds the lease")
        return s.with_candidate(version, fp, owner)

    log.info("reload: %s version %d on %d endpoint(s) (serving %s)", model, version, len(endpoints), state.serving)
    t0 = time.perf_counter()
    before, after, report = control.transition(
        repo, model, change, endpoints, keep_previous=options.keep_previous_loaded
    )
    control.require_converged(report, f"reload of {model} version {version}")
    seconds = time.perf_counter() - t0
    summary = {
        "version": version,
        "previous": before.serving,
        "already_serving": already,
        "candidate": after.candidate,
        "live_composing": report.desired[repo.names.tokenizer],
        "seconds": round(seconds, 3),
        "endpoints": [e.grpc for e in endpoints],
        "actions": report.actions,
    }
    if already:
        msg = f"Triton v{version} already serving on {len(endpoints)} endpoint(s)"
    else:
        msg = (
            f"Triton v{version} loaded as candidate on {len(endpoints)} endpoint(s) in {seconds:.1f}s; "
            f"{repo.names.ensemble} "
            + (f"still serves Triton v{after.serving}" if after.serving is not None else "serves nothing yet")
            + f" (composing live {summary['live_composing']})"
        )
    return summary, msg


def reload(
    release: Release, endpoints: Sequence[Endpoint] | None = None, options: ServingOptions | None = None
) -> StepResult:
    """Load the published version N as the candidate on every endpoint."""
    require(release, STEP)
    endpoints = list(endpoints or endpoints_from_settings(release.settings))
    options = options or ServingOptions.from_spec(release.serving)
    inputs = {
        "version": published_version(release),
        "endpoints": [e.grpc for e in endpoints],
        "repository": str(release.settings.triton_repository),
    }

    def body(out: Path) -> tuple[dict, str]:
        summary, msg = stage(release, endpoints, options)
        (out / "reload.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        return summary, msg

    return release.workspace.run_step(STEP, inputs, body, out_dir=OUT_DIR, always_run=True)
