"""Step 8 — promote: MLflow alias ``champion`` → this release's version, after a passed smoke test.

The version it replaces becomes ``previous-champion``; every move is appended to the registered
model's ``champion_history`` tag (what rollback reads). Safe to repeat.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from seqcls.records import OUT_DIRS, Published, Registered
from seqcls.registry import CHAMPION, PREVIOUS, _alias, _append_history, client, model_version_url
from seqcls.steps import require
from seqcls.workspace import Release, StepResult

STEP = "promote"
OUT_DIR = OUT_DIRS[STEP]


def promote(release: Release) -> StepResult:
    """Move ``champion`` to this release's version (after a passed smoke test)."""
    ws, cfg = release.workspace, release.config
    require(release, STEP)
    version = Registered.load(ws).version
    triton_version = Published.load(ws).version
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

    return ws.run_step(STEP, inputs, body, out_dir=OUT_DIR, always_run=True)
