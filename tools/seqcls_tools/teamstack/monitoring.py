"""The compose file's ``prometheus`` service as a local process: its own command line and configuration
(``docker/prometheus.yml`` with the project's rules), the ``triton:8002`` target mapped to the local
Tritons' metrics ports — one target per replica, as the configuration's comment asks for several."""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from seqcls.localtriton import free_port
from seqcls_tools.teamstack.registry import COMPOSE_FILE, compose_service

log = logging.getLogger(__name__)

PROMETHEUS_CONFIG = COMPOSE_FILE.parent / "docker" / "prometheus.yml"
#: the compose configuration's Triton target, which the local configuration replaces
COMPOSE_TRITON_TARGET = "triton:8002"


def local_prometheus_config(targets: list[str], config: Path = PROMETHEUS_CONFIG) -> dict[str, Any]:
    """``config`` with its rule files made absolute and its Triton target replaced by ``targets``; any other
    target is an error (the local rehearsal would silently scrape nothing there)."""
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["rule_files"] = [str((config.parent / rule).resolve()) for rule in data.get("rule_files") or []]
    for job in data.get("scrape_configs") or []:
        for static in job.get("static_configs") or []:
            if static.get("targets") != [COMPOSE_TRITON_TARGET]:
                raise ValueError(
                    f"{config}: job {job.get('job_name')!r} scrapes {static.get('targets')}, which the local team "
                    f"stack does not map (only {COMPOSE_TRITON_TARGET})"
                )
            static["targets"] = list(targets)
    return data


def local_prometheus_argv(binary: str, config: Path, data_dir: Path, port: int) -> list[str]:
    """The compose service's command with its container paths and listen address mapped to local ones."""
    local = {
        "--config.file": str(config),
        "--storage.tsdb.path": str(data_dir),
        "--web.listen-address": f"127.0.0.1:{port}",
    }
    argv = [binary]
    for arg in map(str, compose_service("prometheus")["command"]):
        flag, _, value = arg.partition("=")
        argv.append(f"{flag}={local.get(flag, value)}")
    return argv


class Prometheus:
    """A throwaway Prometheus under ``root`` scraping ``targets`` with the project's rules."""

    def __init__(self, root: Path, targets: list[str]) -> None:
        self.root = Path(root)
        self.targets = list(targets)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> Prometheus:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("`prometheus` not on PATH (Debian: apt-get install prometheus; scripts/system-deps.sh)")
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "prometheus.yml"
        config.write_text(yaml.safe_dump(local_prometheus_config(self.targets)), encoding="utf-8")
        argv = local_prometheus_argv(binary, config, self.root / "data", self.port)
        with open(self.root / "prometheus.log", "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError((self.root / "prometheus.log").read_text(errors="replace")[-3000:])
            try:
                if urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).status == 200:
                    log.info("Prometheus at %s scraping %s", self.url, ", ".join(self.targets))
                    return self
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"Prometheus did not become ready in {timeout:.0f}s; see {self.root / 'prometheus.log'}")

    def api(self, path: str, **query: str) -> Any:
        """``/api/v1/<path>``'s ``data`` (an error status raises)."""
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus {path}: {body}")
        return body["data"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
