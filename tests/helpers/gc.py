"""Finished release workspaces, published versions and recorded serving states, made by hand for gc's tests."""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from seqcls.contract.names import ModelName
from seqcls.serving.state import ServingState, write_state
from seqcls.settings import Settings

NAME = ModelName("seqcls")
HEAVY_BYTES = 50_000


@pytest.fixture
def mlflow_home(home: Path, empty_mlflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings on a fresh sqlite MLflow store of the test's own; gc's minimum age 0 (registered just now)."""
    db = tmp_path / "mlflow.db"
    shutil.copyfile(empty_mlflow_db, db)
    monkeypatch.setenv("SEQCLS_MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.setenv("SEQCLS_GC_MIN_AGE", "0")
    return Settings.from_env()


def mlflow_client(settings: Settings):
    """The registry client seqcls uses for ``settings``."""
    from seqcls.registry.ledger import client

    return client(settings)


def fp(i: int) -> str:
    return f"{i:02d}" * 32


def when(i: int) -> str:
    """Workspace ``i``'s last write: one day after ``i - 1``'s (the release order gc's evidence horizon reads)."""
    return (datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=i)).isoformat(timespec="seconds")


def workspace(settings: Settings, i: int, *, refused: str | None = None, evalset: str | None = None) -> Path:
    """A finished release workspace: heavy dirs, small evidence, a manifest (refused: a gate step failed)."""
    ws = settings.releases_dir / NAME / fp(i)[:16]
    for name in ("checkpoint", "static", "onnx"):
        (ws / name).mkdir(parents=True)
        (ws / name / "big.bin").write_bytes(b"x" * HEAVY_BYTES)
    (ws / "parity").mkdir()
    (ws / "parity" / "report.json").write_text("{}")
    steps = {"validate": {"status": "ok"}}
    if refused:
        (ws / "failed" / "evaluate").mkdir(parents=True)
        (ws / "failed" / "evaluate" / "evaluation.json").write_text("{}")
        steps["evaluate"] = {"status": "failed", "error": "GateError: quality gate refused", "finished_at": refused}
    manifest = {"schema": 1, "steps": steps, "checkpoint": {"path": "x"}, "fingerprint": fp(i), "updated_at": when(i)}
    if evalset:
        manifest["eval_sets"] = {"/data/test.txt": {"copy": str(settings.eval_sets_dir / evalset), "sha256": "0"}}
    (ws / "manifest.json").write_text(json.dumps(manifest))
    old = 1_000_000_000  # long ago: older than gc_min_age
    os.utime(ws / "manifest.json", (old, old))
    return ws


def publish(settings: Settings, version: int, i: int) -> None:
    """Triton version ``version`` of workspace ``i``: each model's release.json, as publish writes it."""
    repo = Path(str(settings.triton_repository))
    for model in NAME.names.models:
        vdir = repo / model / str(version)
        vdir.mkdir(parents=True)
        info = {"workspace": str(settings.releases_dir / NAME / fp(i)[:16]), "fingerprint": fp(i)}
        (vdir / "release.json").write_text(json.dumps(info))


def serve(settings: Settings, *versions: tuple[int, int]) -> ServingState:
    """Record releases of (Triton version, workspace) in order: the last is served, the one before previous."""
    repo = Path(str(settings.triton_repository))
    state = ServingState.empty(NAME)
    for version, i in versions:
        state = state.with_candidate(version, fp(i), "test").promoted(version, fp(i), "test")
    return write_state(repo, state, expected_generation=0)


def releases(repo: Path, first: int, last: int, state: ServingState | None = None) -> ServingState:
    """Record releases ``first``..``last`` in ``repo``'s state (candidate then promoted: two state lines, two
    history entries each); the state after the last."""
    state = state or ServingState.empty(NAME)
    for v in range(first, last + 1):
        cand = write_state(repo, state.with_candidate(v, fp(v), "t"), expected_generation=state.generation)
        state = write_state(repo, cand.promoted(v, fp(v), "t"), expected_generation=cand.generation)
    return state


def tiny_checkpoints(root: Path, seed: int, count: int = 7) -> list[Path]:
    """``count`` tiny checkpoints (consecutive seeds from ``seed``: other fingerprints) for a gc drill module."""
    from seqcls_tools.testing import build_tiny_checkpoint

    return [build_tiny_checkpoint(root / f"c{i}", seed=seed + i, logit_scale=300.0) for i in range(count)]


def own_home_drill(drill_triton, empty_mlflow_db: Path, tmp_path: Path, monkeypatch, **env: str):
    """A drill with a home and MLflow store of its own (gc must not collect the shared drill home's reused
    workspaces), every workspace old enough to collect, plus ``env``."""
    import shutil

    from tests.helpers.drills import make_drill

    shutil.copyfile(empty_mlflow_db, tmp_path / "mlflow.db")
    for key, value in {"SEQCLS_GC_MIN_AGE": "0", **env}.items():
        monkeypatch.setenv(key, value)
    return make_drill(drill_triton, tmp_path / "home", tmp_path, monkeypatch)


def check_models_file_param(tmp_path: Path, name: str, good: int, bad: str, refused: str) -> None:
    """``name`` is a models-file ``params:`` default: ``good`` is taken as is, ``bad`` refused matching ``refused``."""
    import pytest

    from seqcls.airflow.models_file import load_models
    from seqcls.errors import InputError

    path = tmp_path / "seqcls-models.yaml"
    path.write_text(f"models:\n  - name: alpha\n    params:\n      {name}: {good}\n")
    (alpha,) = load_models(path)
    assert alpha.params[name] == good
    path.write_text(f"models:\n  - name: alpha\n    params:\n      {name}: {bad}\n")
    with pytest.raises(InputError, match=refused):
        load_models(path)
