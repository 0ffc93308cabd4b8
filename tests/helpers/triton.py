"""A real local Triton for tests: started on free loopback ports, and the settings/env that point at it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from seqcls.localtriton import LocalTriton, TritonServerConfig, free_ports
from seqcls.settings import Settings


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


def settings_for(server: LocalTriton, home: Path, source: Path | None = None) -> Settings:
    """Settings pointing the library at ``server`` (its repository and endpoints)."""
    cfg = server.config
    return Settings(
        home=home,
        triton_repository=cfg.repository,
        triton_grpc=(cfg.grpc_url,),
        triton_http=(cfg.http_url,),
        model_repository_source=source,
    )


def module_triton(name: str) -> tuple:
    """The fixtures of a module that shares one real Triton: ``root`` (a module temp dir named
    ``name``), ``triton`` (started on it, stopped after the module) and ``env`` (:func:`cli_env`
    per test). Use as ``root, triton, env = module_triton("my-module")`` at module level."""

    @pytest.fixture(scope="module")
    def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
        return tmp_path_factory.mktemp(name)

    @pytest.fixture(scope="module")
    def triton(root: Path) -> Iterator[LocalTriton]:
        server = start_triton(root)
        yield server
        server.stop()

    @pytest.fixture
    def env(triton: LocalTriton, root: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
        return cli_env(triton, root, monkeypatch)

    return root, triton, env


def dead_triton_sections(funcargs: dict[str, object], lines: int = 40) -> list[tuple[str, str]]:
    """Report sections for a failed test: the log tail of each real Triton it used that has died.

    A crash (an abort inside a backend) leaves nothing else behind once the run's temp dirs are gone;
    ``tests/conftest.py`` adds these to every failed test's report."""
    return [
        (f"tritonserver log tail ({name}: no longer running)", value.log_tail(lines))
        for name, value in funcargs.items()
        if isinstance(value, LocalTriton) and not value.status().running
    ]
