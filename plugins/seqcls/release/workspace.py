"""Release workspaces and their manifest: what makes every step restartable and idempotent.

A workspace is ``<home>/releases/<model name>/<fingerprint[:16]>/``. Its ``checkpoint/`` is the
release's own copy of the checkpoint, taken in (hashed as copied) when the release is opened
(:mod:`seqcls.checkpoints.snapshot`): every step, in this process or a later Airflow task, reads
that copy and never the operator's directory, so a checkpoint changed in place has no effect. Each step writes its files
into a staging directory and, only when it succeeded, renames it to its output directory and
records in ``manifest.json`` what it read (``inputs``, hashed into ``inputs_key``), what it wrote
(paths + sha256), library versions and timings. Running a step again with the same inputs and
intact outputs is a skip that says so; changed inputs redo it. A failed step is recorded as
failed (its partial outputs kept under ``failed/<step>/`` for a person to read), so nothing
downstream can mistake it for success. XCom only ever carries the workspace path and summaries.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from seqcls.checkpoints.checkpoint import Checkpoint, sha256_file
from seqcls.config import ReleaseConfig, serving_spec
from seqcls.contract.names import ModelName, require_name
from seqcls.errors import SeqclsError, StepOrderError
from seqcls.files import atomic_write, held, out_of_space, replace_dir, resource_error
from seqcls.settings import Settings
from seqcls.spec import ServingSpec

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FAILED_DIR = "failed"  # <workspace>/failed/<step>/: a failed run's partial outputs, kept for a person
SCHEMA = 1
TRACKED_PACKAGES = (
    "paddlepaddle",
    "paddlenlp",
    "paddle2onnx",
    "torch",
    "transformers",
    "onnx",
    "onnxruntime",
    "tokenizers",
    "seqcls",
)


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str | None]:
    """Installed versions from package metadata (no imports: cheap enough for every step)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _timing(started: str, seconds: float) -> dict[str, Any]:
    """The timing and version fields every step record carries."""
    return {
        "seconds": round(seconds, 3),
        "started_at": started,
        "finished_at": _now(),
        "versions": package_versions(),
    }


def inputs_key(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class StepResult:
    """What a step did: serialisable to JSON for the manifest, the CLI and XCom."""

    step: str
    status: str  # "ok" | "skipped" | "failed"
    workspace: str
    outputs: dict[str, str] = field(default_factory=dict)  # path relative to workspace -> sha256
    summary: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        return f"{self.step}: {self.status} in {self.seconds:.1f}s — {self.message}"


class Workspace:
    """One release workspace directory and its manifest (file-locked read-modify-write)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST

    def path(self, rel: str) -> Path:
        return self.root / rel

    def lock(self, *, timeout: float = 3600.0):
        """Exclusive lock: two runs of the same release never write the workspace at once (a step may
        hold it for as long as an export takes; a waiter gives up after ``timeout``, naming the holder)."""
        return held(self.root / ".lock", timeout=timeout, what=f"a step of release {self.root.name}", error=SeqclsError)

    def read(self) -> dict[str, Any]:
        if not self.manifest_path.exists():
            return {"schema": SCHEMA, "steps": {}, "history": []}
        return json.loads(self.manifest_path.read_text(encoding="utf-8"))

    def write(self, manifest: dict[str, Any]) -> None:
        manifest["updated_at"] = _now()
        atomic_write(self.manifest_path, json.dumps(manifest, indent=2, ensure_ascii=False, default=str))

    def step(self, name: str) -> dict[str, Any] | None:
        return self.read()["steps"].get(name)

    def succeeded(self, name: str) -> bool:
        """Whether step ``name``'s latest run is recorded as ok."""
        rec = self.step(name)
        return bool(rec) and rec.get("status") == "ok"

    def failed_dir(self, name: str) -> Path:
        """Where the last failed run of step ``name`` left its partial outputs (may not exist)."""
        return self.root / FAILED_DIR / name

    def require(self, name: str, *, hint: str | None = None) -> dict[str, Any]:
        """The record of a step that must have succeeded; a clear error otherwise."""
        rec = self.step(name)
        if not rec or rec.get("status") != "ok":
            state = "has not run" if not rec else f"is {rec.get('status')} ({rec.get('error', '')[:200]})"
            raise StepOrderError(
                f"step {name!r} {state} for workspace {self.root}; run {hint or f'`seqcls {name}`'} first."
            )
        return rec

    def outputs_intact(self, rec: dict[str, Any]) -> bool:
        return not self.damaged_outputs(rec)

    def damaged_outputs(self, rec: dict[str, Any]) -> list[str]:
        """The recorded outputs of ``rec`` that are missing or no longer hash as recorded."""
        damaged = []
        for rel, digest in rec.get("outputs", {}).items():
            p = self.root / rel
            if not p.is_file() or sha256_file(p) != digest:
                damaged.append(rel)
        return damaged

    def record(self, name: str, rec: dict[str, Any]) -> None:
        manifest = self.read()
        manifest["steps"][name] = rec
        manifest.setdefault("history", []).append(
            {"step": name, "status": rec["status"], "at": _now(), "seconds": rec.get("seconds")}
        )
        self.write(manifest)

    def annotate(self, **values: Any) -> None:
        """Set top-level manifest fields (model name, fingerprint, checkpoint, config...)."""
        with self.lock():
            manifest = self.read()
            manifest.update(values)
            self.write(manifest)

    def run_step(
        self,
        name: str,
        inputs: dict[str, Any],
        body: Callable[[Path], tuple[dict[str, Any], str]],
        *,
        out_dir: str,
        always_run: bool = False,
    ) -> StepResult:
        """Run ``body(staging_dir) -> (summary, message)`` unless done already with these inputs.

        Outputs are every file ``body`` leaves in the staging directory; they appear at
        ``<workspace>/<out_dir>/`` only if ``body`` returns. ``always_run`` is for steps whose
        truth is outside the workspace (a live repository, a server): they re-check every time
        and report "already done" themselves. A full disk is a ResourceError naming the workspace
        and its free space (recorded as the step's failure when the body hit it), not an OSError.
        """
        try:
            return self._run_step(name, inputs, body, out_dir=out_dir, always_run=always_run)
        except OSError as exc:
            if out_of_space(exc):
                raise resource_error(self.root, exc, f"step {name}") from exc
            raise

    def _run_step(
        self,
        name: str,
        inputs: dict[str, Any],
        body: Callable[[Path], tuple[dict[str, Any], str]],
        *,
        out_dir: str,
        always_run: bool,
    ) -> StepResult:
        key = inputs_key(inputs)
        with self.lock():
            rec = self.step(name)
            done = rec and rec.get("status") == "ok" and rec.get("inputs_key") == key
            if done and not always_run and self.outputs_intact(rec):
                return self._skipped(name, rec)
            if rec and rec.get("status") == "ok" and not always_run:  # always_run steps re-check by design
                log.info("%s: %s since its last run — redoing", name, _why_redo(rec, inputs, key, self))
            staging = self._fresh_staging(name)
            started, t0 = _now(), time.perf_counter()
            try:
                summary, message = body(staging)
            except BaseException as exc:
                seconds = time.perf_counter() - t0
                full = out_of_space(exc) and not isinstance(exc, SeqclsError)  # a seqcls error already says where
                where = Path(getattr(exc, "filename", None) or self.root)
                error = resource_error(where, exc, f"step {name}") if full else exc
                self._record_failure(name, inputs, key, error, staging, out_dir, started, seconds)
                if isinstance(error, SeqclsError):
                    log.error("%s: failed after %.1fs — %s", name, seconds, error)
                if error is not exc:
                    raise error from exc
                raise
            seconds = time.perf_counter() - t0
            outputs = self._publish_staging(name, staging, out_dir)
            self.record(
                name,
                {
                    "status": "ok",
                    "inputs": inputs,
                    "inputs_key": key,
                    "outputs": outputs,
                    "summary": summary,
                    "message": message,
                    **_timing(started, seconds),
                },
            )
            log.debug("%s: done in %.1fs — %s", name, seconds, message)  # the caller logs result.line()
            return StepResult(name, "ok", str(self.root), outputs, summary, seconds, message)

    def _skipped(self, name: str, rec: dict[str, Any]) -> StepResult:
        log.info("%s: already done for these inputs (%s) — skipped", name, rec.get("finished_at"))
        return StepResult(
            name,
            "skipped",
            str(self.root),
            rec["outputs"],
            rec.get("summary", {}),
            0.0,
            f"already done at {rec.get('finished_at')}: {rec.get('message', '')}",
        )

    def _fresh_staging(self, name: str) -> Path:
        staging = self.root / ".staging" / name
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        return staging

    def _record_failure(
        self,
        name: str,
        inputs: dict[str, Any],
        key: str,
        exc: BaseException,
        staging: Path,
        out_dir: str,
        started: str,
        seconds: float,
    ) -> None:
        """Keep the partial outputs under ``failed/<step>/``, drop stale outputs, record the failure."""
        failed_dir = self.failed_dir(name)
        shutil.rmtree(failed_dir, ignore_errors=True)
        shutil.rmtree(self.root / out_dir, ignore_errors=True)  # stale for these inputs
        try:
            failed_dir.parent.mkdir(parents=True, exist_ok=True)
            replace_dir(staging, failed_dir)
        except OSError as exc:  # e.g. no inode left for failed/: the partial outputs go, the record stays
            log.warning("%s: partial outputs not kept (%s)", name, exc)
            shutil.rmtree(staging, ignore_errors=True)
        self.record(
            name,
            {
                "status": "failed",
                "inputs": inputs,
                "inputs_key": key,
                "outputs": {},
                "error": f"{type(exc).__name__}: {exc}",
                "failed_outputs": str(failed_dir.relative_to(self.root)),
                **_timing(started, seconds),
            },
        )

    def _publish_staging(self, name: str, staging: Path, out_dir: str) -> dict[str, str]:
        """Swap the staging directory in as ``out_dir``; the outputs' relative paths and sha256."""
        final = self.root / out_dir
        trash = self.root / ".staging" / f"{name}.old"
        shutil.rmtree(trash, ignore_errors=True)
        if final.exists():
            replace_dir(final, trash)
        final.parent.mkdir(parents=True, exist_ok=True)
        replace_dir(staging, final)
        shutil.rmtree(trash, ignore_errors=True)
        shutil.rmtree(self.failed_dir(name), ignore_errors=True)
        return {str(p.relative_to(self.root)): sha256_file(p) for p in sorted(final.rglob("*")) if p.is_file()}

    def mark(self, name: str, **values: Any) -> None:
        """Merge ``values`` into an existing step record (e.g. a published version marked failed)."""
        with self.lock():
            manifest = self.read()
            manifest["steps"].setdefault(name, {}).update(values)
            manifest.setdefault("history", []).append({"step": name, "at": _now(), **values})
            self.write(manifest)


@dataclass
class Release:
    """Everything a step needs: settings, parameters, the validated checkpoint, its workspace, and how it is
    served (:class:`~seqcls.spec.ServingSpec`: resolved once by the intake, recorded in the workspace)."""

    settings: Settings
    config: ReleaseConfig
    checkpoint: Checkpoint
    workspace: Workspace
    serving: ServingSpec = None  # type: ignore[assignment]  # None: resolved from config and settings

    def __post_init__(self) -> None:
        if self.serving is None:
            self.serving = serving_spec(self.config, self.settings)


def _why_redo(rec: dict[str, Any], inputs: dict[str, Any], key: str, ws: Workspace) -> str:
    """Which inputs changed (by name), else which outputs are missing or changed."""
    if rec.get("inputs_key") != key:
        before = rec.get("inputs") or {}
        changed = sorted(
            k for k in {*before, *inputs} if inputs_key({k: before.get(k)}) != inputs_key({k: inputs.get(k)})
        )
        return f"inputs changed ({', '.join(changed) or 'their encoding'})"
    damaged = ws.damaged_outputs(rec)
    shown = ", ".join(damaged[:3]) + (f" and {len(damaged) - 3} more" if len(damaged) > 3 else "")
    return f"outputs missing or changed ({shown})"


def workspace_dir(settings: Settings, model: ModelName, fingerprint: str) -> Path:
    return settings.releases_dir / require_name(model) / fingerprint[:16]
