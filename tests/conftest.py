"""Shared fixtures: tiny real ERNIE checkpoints, built once per test run, and isolated homes."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from seqcls.localtriton import LocalTriton, TritonServerConfig, free_ports
from seqcls_tools.testing import TINY_CORPUS

# Keep every test off the user's real ~/.seqcls and ~/airflow, and the logs readable.
os.environ.setdefault("GLOG_minloglevel", "2")
os.environ.setdefault("FLAGS_call_stack_level", "0")


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


#: Golden texts for the HF checkpoints: the tiny corpus plus what stresses a tokenizer (case,
#: accents, emoji, full-width forms, a text longer than max_length).
HF_GOLDEN = (
    *TINY_CORPUS[:6],
    "Café Über naïve ÉLAN 🎉 ２０２４年 ｆｕｌｌ－ｗｉｄｔｈ",
    "中国队以3比1战胜对手，获得冠军。" * 12,
    "mixed 文本 with English words and 数字 12345 ...",
)


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

    http, grpc, metrics = free_ports(3)
    cfg = TritonServerConfig(
        repository=tmp_path / "repo",
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        state_dir=tmp_path / "triton-state",
    )
    srv = LocalTriton(cfg)
    srv.start()
    yield srv
    srv.stop()
    assert not srv.status().running


def start_triton(root: Path, name: str = "triton", *, repository: Path | None = None, **config) -> LocalTriton:
    """A started real local Triton on free loopback ports: repository ``root/repo`` unless given,
    state in ``root/<name>-state``; the caller stops it (module fixtures share one per module)."""
    http, grpc, metrics = free_ports(3)
    server = LocalTriton(
        TritonServerConfig(
            repository=repository or root / "repo",
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            state_dir=root / f"{name}-state",
            **config,
        )
    )
    server.start()
    return server


def cli_env(server: LocalTriton, root: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment that points the library (this process, via ``monkeypatch``) and ``seqcls``
    CLI subprocesses (the returned dict) at ``server``, a home and an MLflow sqlite store under ``root``."""
    values = {
        "SEQCLS_HOME": str(root / "home"),
        "SEQCLS_TRITON_REPOSITORY": str(server.config.repository),
        "SEQCLS_TRITON_GRPC": server.config.grpc_url,
        "SEQCLS_TRITON_HTTP": server.config.http_url,
        "SEQCLS_TRITON_METRICS": server.config.metrics_url,
        "SEQCLS_MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return {**os.environ, **values, "PYTHONUNBUFFERED": "1"}


def settings_for(server, home: Path, source: Path | None = None):
    """Settings pointing the library at ``server`` (its repository and endpoints)."""
    from seqcls.settings import Settings

    cfg = server.config
    return Settings(
        home=home,
        triton_repository=cfg.repository,
        triton_grpc=(cfg.grpc_url,),
        triton_http=(cfg.http_url,),
        model_repository_source=source,
    )


def private_airflow_home() -> Path:
    """One AIRFLOW_HOME per pytest process, shared by the Airflow test modules (never ~/airflow), removed at exit.

    Set before anything imports airflow: its configuration is read once per process.
    """
    home = os.environ.get("SEQCLS_TEST_AIRFLOW_HOME")
    if not home:
        if "airflow.configuration" in sys.modules:
            pytest.skip("airflow was imported before the Airflow tests could isolate AIRFLOW_HOME")
        home = tempfile.mkdtemp(prefix="seqcls-airflow-")
        atexit.register(shutil.rmtree, home, ignore_errors=True)
        os.environ.update(
            SEQCLS_TEST_AIRFLOW_HOME=home,
            AIRFLOW_HOME=home,
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__DAGS_FOLDER=str(Path(__file__).resolve().parents[1] / "dags"),
            AIRFLOW__CORE__PLUGINS_FOLDER=str(Path(__file__).resolve().parents[1] / "plugins"),
            AIRFLOW__CORE__PARALLELISM="4",
        )
    return Path(home)
