"""Shared fixtures: tiny real ERNIE checkpoints, built once per test run, and isolated homes."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from seqcls.localtriton import LocalTriton
from seqcls_tools.teamstack import MlflowServer, Postgres, pg_bindir
from tests.helpers.checkpoints import HF_GOLDEN
from tests.helpers.drills import Drill, DrillStore, make_drill
from tests.helpers.triton import dead_triton_sections, start_triton

# Keep every test off the user's real ~/.seqcls and ~/airflow, and the logs readable.
os.environ.setdefault("GLOG_minloglevel", "2")
os.environ.setdefault("FLAGS_call_stack_level", "0")


#: Test files that take minutes, longest first. `make test` runs two pytest-xdist workers that take whole
#: files in collection order: starting these first lets the short files fill the end evenly instead of
#: one worker finishing a long file alone. (Order only: every file still runs; a file missing here runs
#: after these, in its usual order.)
LONG_FILES = (
    "test_airflow_dag.py",
    "test_team_stack.py",
    "test_drills.py",
    "test_team_registry_race.py",
    "test_demo_main.py",
    "test_airflow_ui.py",
    "test_airflow_approval.py",
    "test_state_integrity.py",
    "test_many_models.py",
    "test_serving_triton.py",
    "test_transitions.py",
    "test_registry.py",
    "test_bench.py",
    "test_airflow_models.py",
    "test_verdicts_airflow.py",
    "test_monitoring_serving.py",
    "test_hf.py",
    "test_quality_gate.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker picks free ports from its own slice (``SEQCLS_PORT_RANGE``, of the one given
    or the default range), inherited by every process it starts: picks from one shared range handed the
    same port to servers of both workers (another worker's Triton answered on the Airflow api-server's port)."""
    from seqcls.localtriton.ports import PORT_RANGE_VAR, default_port_range, port_range, port_slice

    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit():
        low, high = port_range() or default_port_range()
        os.environ[PORT_RANGE_VAR] = "{}-{}".format(*port_slice(int(worker[2:]), int(count), low, high))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))  # stable: the rest keep their order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.extend(dead_triton_sections(getattr(item, "funcargs", {})))


@pytest.fixture(autouse=True)
def _restored_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets back the ``sys.path`` it started with. MLflow's pyfunc loading prepends the model's code
    directory and leaves it there; a later test's spawned process (multiprocessing sends the parent's path)
    then imported ``seqcls_contract`` from a model directory the earlier test's home no longer held."""
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "seqcls-home"
    monkeypatch.setenv("SEQCLS_HOME", str(home))
    for var in (
        "SEQCLS_MLFLOW_TRACKING_URI",
        "MLFLOW_TRACKING_URI",
        "SEQCLS_TRITON_REPOSITORY",
        "SEQCLS_TRITON_GRPC",
        "SEQCLS_TRITON_HTTP",
        "SEQCLS_TRITON_CONTROL_KEY",
        # an in-process dag.test() leaves Airflow's task context in os.environ: a later test's release
        # would record itself as that task's (who changed what, MLflow's airflow.* lineage tags)
        "AIRFLOW_CTX_DAG_ID",
        "AIRFLOW_CTX_DAG_RUN_ID",
        "AIRFLOW_CTX_TRY_NUMBER",
        "SEQCLS_AIRFLOW_RUN_URL",
    ):
        monkeypatch.delenv(var, raising=False)
    return home


@pytest.fixture
def home(_isolated_home: Path) -> Path:
    return _isolated_home


def _build(path: Path, **kwargs) -> Path:
    from seqcls_tools.testing import build_tiny_checkpoint

    return build_tiny_checkpoint(path, **kwargs)


@pytest.fixture(scope="session")
def tiny_checkpoint_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random ERNIE classifier (7 hierarchical labels), confident logits, built-in golden set."""
    return _build(tmp_path_factory.mktemp("ckpt") / "tiny", seed=0, logit_scale=300.0)


@pytest.fixture(scope="session")
def tiny_checkpoint_b_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second tiny checkpoint (another seed → other weights and fingerprint)."""
    return _build(tmp_path_factory.mktemp("ckpt") / "tiny_b", seed=1, logit_scale=300.0)


@pytest.fixture(scope="session")
def hf_checkpoints_src(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random Hugging Face classifiers (``transformers`` save_pretrained layout), built once:
    ``{"deberta-v2": dir, "bert": dir}``; confident logits, :data:`HF_GOLDEN` as golden.txt."""
    pytest.importorskip("torch", reason="the torch extra (make setup-torch) is not installed")
    from seqcls_tools.testing_hf import ARCHITECTURES, build_tiny_hf_checkpoint

    root = tmp_path_factory.mktemp("hf-ckpt")
    return {
        arch: build_tiny_hf_checkpoint(root / arch, architecture=arch, seed=i, logit_scale=60.0, golden=HF_GOLDEN)
        for i, arch in enumerate(ARCHITECTURES)
    }


@pytest.fixture(scope="session")
def hf_pickle_checkpoints_src(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The :func:`hf_checkpoints_src` models (same seeds, so the same tensors) saved as checkpoints saved before
    safetensors were the default: ``{"bert": pytorch_model.bin, "deberta-v2": sharded pytorch_model-*.bin}``."""
    pytest.importorskip("torch", reason="the torch extra (make setup-torch) is not installed")
    from seqcls_tools.testing_hf import ARCHITECTURES, build_tiny_hf_checkpoint

    root = tmp_path_factory.mktemp("hf-pickle-ckpt")
    shards = {"deberta-v2": "40KB", "bert": None}
    return {
        arch: build_tiny_hf_checkpoint(
            root / arch,
            architecture=arch,
            seed=i,
            logit_scale=60.0,
            golden=HF_GOLDEN,
            safe_serialization=False,
            max_shard_size=shards[arch],
        )
        for i, arch in enumerate(ARCHITECTURES)
    }


@pytest.fixture
def tiny_checkpoint(tiny_checkpoint_src: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny checkpoint, safe to damage."""
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint_src, dst)
    return dst


@pytest.fixture
def tiny_checkpoint_b(tiny_checkpoint_b_src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt_b"
    shutil.copytree(tiny_checkpoint_b_src, dst)
    return dst


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalTriton]:
    """A real local Triton (explicit mode, loopback, free ports) for one test; stopped afterwards."""
    srv = start_triton(tmp_path)
    yield srv
    srv.stop()
    assert not srv.status().running


# --- the drill harness (tests/helpers/drills.py): one Triton per drill module, one release home per run


@pytest.fixture(scope="session")
def drill_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shared by every drill: workspaces (exports of the tiny checkpoints) are reused across drills."""
    return tmp_path_factory.mktemp("drill-home")


@pytest.fixture(scope="module")
def drill_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("drills")


@pytest.fixture(scope="module")
def drill_repository_kind() -> str:
    """Where a drill module's repository is: a directory (``posix``). A module overrides this fixture
    (``params=["posix", "s3"]``) to run its drills on the session's SeaweedFS too (``tests/test_drills.py``)."""
    return "posix"


@pytest.fixture(scope="module")
def drill_store(drill_repository_kind: str, request: pytest.FixtureRequest) -> DrillStore | None:
    """The module's ``s3://`` repository (a fresh prefix of the session's SeaweedFS: the module must import
    the ``seaweedfs`` fixture), or None for a directory."""
    if drill_repository_kind == "posix":
        return None
    assert drill_repository_kind == "s3", f"drill_repository_kind {drill_repository_kind!r}: posix or s3"
    seaweedfs = request.getfixturevalue("seaweedfs")
    return DrillStore.fresh(seaweedfs.endpoint, seaweedfs.bucket, seaweedfs.credentials)


@pytest.fixture(scope="module")
def drill_triton(drill_root: Path, drill_store: DrillStore | None) -> Iterator[LocalTriton]:
    if drill_store is None:
        server = start_triton(drill_root, "triton", repository=drill_root / "repo")
    else:  # state dir of its own: the module's POSIX Triton ran from the same root
        server = start_triton(drill_root, "triton-s3", **drill_store.triton_config())
    yield server
    server.stop()


@pytest.fixture(scope="session")
def empty_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow sqlite store as its first client leaves it (schema created and migrated, nothing in it),
    made once: a copy is a fresh store without MLflow's migrations each time (~1-2 s on 2 cores)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow-empty') / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri, registry_uri=uri).search_registered_models(max_results=1)  # what a first use does
    return Path(uri[len("sqlite:///") :])


@pytest.fixture(scope="session")
def team_postgres() -> Iterator[Postgres]:
    """A throwaway PostgreSQL cluster on loopback (Debian's postgresql), once per test session (per worker)."""
    try:
        pg_bindir()
    except FileNotFoundError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{exc} — required under CI")
        pytest.skip(str(exc))
    pg = Postgres().start()
    yield pg
    pg.stop()


@pytest.fixture(scope="session")
def team_mlflow(team_postgres: Postgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """The compose file's MLflow server as a local process: PostgreSQL store and auth database, basic auth on,
    proxied artifacts; once per session (drills may kill -9 it and start it again, same port and store)."""
    server = MlflowServer(team_postgres, tmp_path_factory.mktemp("team-mlflow")).prepare()
    server.start()
    yield server
    server.kill()


@pytest.fixture
def drill(
    drill_triton: LocalTriton,
    drill_store: DrillStore | None,
    drill_home: Path,
    empty_mlflow_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Drill:
    shutil.copyfile(empty_mlflow_db, tmp_path / "mlflow.db")  # the drill's own MLflow database, fresh
    return make_drill(drill_triton, drill_home, tmp_path, monkeypatch, store=drill_store)
