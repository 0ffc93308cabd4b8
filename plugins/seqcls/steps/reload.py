"""Step 6 — reload: make every Triton endpoint serve version N, without dropping a request.

Order matters in explicit model-control mode. The ensemble serving N-1 pins its composing
models to N-1, so the composing models are first loaded with versions ``[N-1, N]`` side by side
(their configs' ``version_policy``), each verified ready; only then is the ensemble switched to N
(Triton keeps N-1 serving until N is ready). N-1 stays loaded behind it, so a rollback is just the
ensemble switching back. Before touching anything, the prior ``config.pbtxt`` files are saved in
the step's output — :mod:`seqcls.steps.rollback` restores exactly that state.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seqcls.errors import ServingError
from seqcls.records import OUT_DIRS, published_version
from seqcls.serving.client import Endpoint, TritonOps, endpoints_from_settings, ops_for
from seqcls.serving.names import COMPOSING, ENSEMBLE, MODELS
from seqcls.serving.repository import SNAPSHOT, Repository, ServingOptions, parse_config
from seqcls.steps import require
from seqcls.workspace import Release, StepResult

log = logging.getLogger(__name__)

STEP = "reload"
OUT_DIR = OUT_DIRS[STEP]
PRIOR_FILE = "prior.json"


def capture_prior(repo: Repository) -> dict[str, Any]:
    """The live state to return to: every model's config text (None = not configured)."""
    return {"configs": {m: repo.config_text(m) for m in MODELS}, "serving_version": repo.serving_version()}


def switch_to(repo: Repository, ops: Sequence[TritonOps], version: int, *, keep_previous: bool = True) -> dict:
    """Write configs for ``version`` and load them on every endpoint, verifying readiness."""
    previous = repo.serving_version()
    complete = set(repo.complete_versions())
    if version not in complete:
        raise ServingError(f"version {version} is not complete in {repo.root} (have {sorted(complete)})")
    damaged = repo.damaged_files(version)
    if damaged:
        raise ServingError(
            f"version {version} in {repo.root} was modified after publishing ({'; '.join(damaged[:5])}); "
            "publish the release again instead of editing a version in place"
        )
    live = [version]
    if keep_previous and previous is not None and previous != version and previous in complete:
        live = [previous, version]
    configs = {m: repo.config_for(m, version, live if m in COMPOSING else [version]) for m in MODELS}
    for model, text in configs.items():  # nothing live is touched unless every config parses
        parse_config(text, f"{repo.root / model}/{version}/{SNAPSHOT}")
    timings: dict[str, float] = {}
    for model in COMPOSING:
        repo.write_config(model, configs[model])
        for op in ops:
            t0 = time.perf_counter()
            op.load(model)
            op.verify_ready(model, live)
            timings[f"{op.endpoint.grpc}/{model}"] = round(time.perf_counter() - t0, 3)
    repo.write_config(ENSEMBLE, configs[ENSEMBLE])
    for op in ops:
        t0 = time.perf_counter()
        op.load(ENSEMBLE)
        op.verify_ready(ENSEMBLE, [version])
        timings[f"{op.endpoint.grpc}/{ENSEMBLE}"] = round(time.perf_counter() - t0, 3)
    return {"version": version, "previous": previous, "live_composing": live, "load_seconds": timings}


def restore(repo: Repository, ops: Sequence[TritonOps], prior: dict[str, Any], failed_version: int | None) -> dict:
    """Return every endpoint to ``prior`` (from :func:`capture_prior`).

    Order per endpoint follows what the server actually serves: if the ensemble already switched
    to the failed version, it goes back first (its composing N-1 versions are still loaded, so no
    request fails); if it never switched, the composing models go back first, because a failed
    version's composing configs may be incompatible with the old ensemble (e.g. a changed dtype).
    """
    configs: dict[str, str | None] = prior["configs"]
    actions = []
    plans = []
    for op in ops:
        switched = failed_version is not None and op.ready(ENSEMBLE, failed_version)
        plans.append((op, (ENSEMBLE, *COMPOSING) if switched else (*COMPOSING, ENSEMBLE)))
    # Configs are shared by all endpoints: restore each one just before its first load.
    restored: set[str] = set()
    for op, order in plans:
        for model in order:
            if model not in restored:
                repo.restore_config(model, configs.get(model))
                restored.add(model)
            if configs.get(model) is None:
                if op.ready(model):
                    op.unload(model)
                actions.append(f"{op.endpoint.grpc}: unloaded {model}")
            else:
                op.load(model)
                versions = repo.live_versions(model)
                op.verify_ready(model, versions)
                actions.append(f"{op.endpoint.grpc}: {model} back to {versions}")
    for model in MODELS:  # configs of models no endpoint needed are restored too
        if model not in restored:
            repo.restore_config(model, configs.get(model))
    return {"restored_version": prior.get("serving_version"), "actions": actions}


def reload(
    release: Release, endpoints: Sequence[Endpoint] | None = None, options: ServingOptions | None = None
) -> StepResult:
    """Serve the published version N on every endpoint (already serving N → says so)."""
    ws = release.workspace
    require(release, STEP)
    version = published_version(release)
    endpoints = list(endpoints or endpoints_from_settings(release.settings))
    options = options or ServingOptions.from_settings(release.settings)
    repo = Repository.from_settings(release.settings)
    inputs = {"version": version, "endpoints": [e.grpc for e in endpoints], "repository": str(repo.root)}

    def body(out: Path) -> tuple[dict, str]:
        ops = ops_for(endpoints)
        for op in ops:
            op.require_live()
        with repo.lock():
            current = repo.serving_version()
            if current == version and all(op.ready(ENSEMBLE, version) for op in ops):
                summary = {
                    "version": version,
                    "previous": None,
                    "already_serving": True,
                    "endpoints": [e.grpc for e in endpoints],
                }
                (out / "reload.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
                return summary, f"version {version} already serving on {len(ops)} endpoint(s)"
            prior = capture_prior(repo)
            (out / PRIOR_FILE).write_text(json.dumps(prior, indent=1), encoding="utf-8")
            log.info("reload: switching %d endpoint(s) from version %s to %d", len(ops), current, version)
            t0 = time.perf_counter()
            result = switch_to(repo, ops, version, keep_previous=options.keep_previous_loaded)
        seconds = time.perf_counter() - t0
        summary = {
            **result,
            "already_serving": False,
            "seconds": round(seconds, 3),
            "endpoints": [e.grpc for e in endpoints],
        }
        (out / "reload.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        return summary, (
            f"version {version} ready on {len(ops)} endpoint(s) in {seconds:.1f}s "
            f"(previous {result['previous']}, composing live {result['live_composing']})"
        )

    return ws.run_step(STEP, inputs, body, out_dir=OUT_DIR, always_run=True)
