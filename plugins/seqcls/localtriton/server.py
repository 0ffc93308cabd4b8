"""Run a real local Triton Inference Server, started and stopped by seqcls itself.

We do not use pytriton's own launcher: it ties the server's life to the Python process (which
would kill it when ``seqcls triton start`` or an Airflow task exits) and always loads its own
proxy models. Instead the server runs in its own session, detached from the caller, with its
pid, state and log in ``state_dir`` (``Settings.triton_dir``), so a later process (CLI, another
Airflow task) can find, query and stop it. Start and stop hold a file lock in ``state_dir``, so
parallel Airflow tasks never start two servers; the state file records the server's pid *and*
creation time, so a reused pid is never mistaken for ours.

The stub puts ``""`` (its cwd), the model's version dir (``<model>/1``) and the model dir on
``sys.path``; the server runs with ``cwd=state_dir`` so no stray module from wherever the CLI
was launched can shadow a model's imports.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from seqcls.errors import ServingError
from seqcls.files import atomic_write, replace_file
from seqcls.localtriton import keys, process
from seqcls.localtriton.config import TritonServerConfig, hostport, repository_value
from seqcls.localtriton.distribution import TritonDistribution, find_libpython, prepare_server, server_environment
from seqcls.localtriton.health import probe, tail, wait_until_live
from seqcls.localtriton.ports import check_ports_free
from seqcls.settings import control_headers, read_control_key

log = logging.getLogger(__name__)

DEFAULT_STOP_TIMEOUT = 30.0

PID_FILE = "tritonserver.pid"
STATE_FILE = "tritonserver.json"
LOG_FILE = "tritonserver.log"
LOCK_FILE = "tritonserver.lock"


@dataclass(frozen=True)
class TritonStatus:
    """What a local server is doing; ``to_dict`` is what ``seqcls triton status`` prints.

    URLs are ``host:port`` as tritonclient's ``url`` argument wants them. ``ready`` is server
    readiness with --strict-readiness=false ("accepting requests"); check models one by one.
    """

    running: bool
    pid: int | None
    live: bool
    ready: bool
    http_url: str
    grpc_url: str
    metrics_url: str
    log_path: Path
    version: str | None
    repository: Path | str
    state_dir: Path
    detail: str

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("log_path", "repository", "state_dir"):
            data[key] = str(data[key])
        return data


class LocalTriton:
    """One Triton process per ``state_dir``; any process (CLI, Airflow task) can find and stop it.

    ``with LocalTriton(cfg) as srv:`` stops the server on exit only if this object started it,
    so using it around a server started by ``seqcls triton start`` leaves that server running.
    """

    def __init__(self, config: TritonServerConfig, *, distribution: TritonDistribution | None = None) -> None:
        self.config = config
        self._distribution = distribution
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_here = False

    # -- paths

    @property
    def pid_path(self) -> Path:
        return self.config.state_dir / PID_FILE

    @property
    def state_path(self) -> Path:
        return self.config.state_dir / STATE_FILE

    @property
    def log_path(self) -> Path:
        return self.config.state_dir / LOG_FILE

    # -- public API

    def start(self, wait: bool = True) -> TritonStatus:
        """Start the server (or find ours already running with the same repository and ports)."""
        cfg = self.config
        with self._lock():
            state, running = self._running()
            if state is not None and running is not None:
                return self._already_running(state, running, wait)
            self._clean_stale(state)

            dist = self._distribution or TritonDistribution.locate()
            libpython = find_libpython()
            check_ports_free(cfg)
            cfg.prepare_repository()
            server_dir = prepare_server(dist, cfg.state_dir)
            process.warn_low_shm()

            shm_prefix = f"seqcls-{secrets.token_hex(4)}-"
            key = cfg.control_key or keys.ensure_key(cfg.repository)
            cmd = cfg.command(server_dir, shm_prefix, key)
            env = cfg.process_environment(server_environment(dist, libpython))
            self._rotate_log()
            log.info("starting tritonserver %s: HTTP %s, gRPC %s", dist.version, cfg.http_url, cfg.grpc_url)
            log.debug("tritonserver command: %s", " ".join(keys.masked(cmd, key)))
            started = time.monotonic()
            try:
                with self.log_path.open("ab") as log_file:
                    proc = subprocess.Popen(
                        cmd,
                        stdin=subprocess.DEVNULL,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        cwd=cfg.state_dir,
                        env=env,
                        start_new_session=True,  # survives the CLI/Airflow task; killpg reaches stubs
                        close_fds=True,
                    )
            except OSError as exc:
                raise ServingError(
                    f"could not execute {cmd[0]}: {exc}. Delete {server_dir} to have it prepared again."
                ) from None  # the OSError may quote the command line, key included
            self._proc = proc
            self._started_here = True
            self._write_state(proc.pid, shm_prefix, server_dir, dist)
            if not wait:
                return self.status()
            try:
                wait_until_live(cfg.http_url, cfg.startup_timeout, process=proc, log_path=self.log_path, secret=key)
            except BaseException:
                self._terminate(proc.pid, shm_prefix, timeout=5.0)
                self._remove_state_files()
                self._started_here = False
                raise
            elapsed = time.monotonic() - started
            log.info("tritonserver pid %d live after %.1f s", proc.pid, elapsed)
            status = self.status()
            return _with_detail(status, f"started (live after {elapsed:.1f} s)")

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
        """SIGTERM the server's process group, SIGKILL what outlives ``timeout``; clean pid/shm files."""
        with self._lock():
            state, running = self._running()
            if state is None:
                log.info("tritonserver (state %s) is not running", self.config.state_dir)
                return
            if running is None:
                log.info("tritonserver pid %s is no longer running; removing stale state", state.get("pid"))
                self._clean_stale(state)
                return
            self._terminate(int(state["pid"]), state.get("shm_prefix"), timeout=timeout)
            self._remove_state_files()
            self._started_here = False
            log.info("tritonserver pid %s stopped", state["pid"])

    def status(self) -> TritonStatus:
        """Process and HTTP health of our server; never raises for a stopped or half-started one."""
        cfg = self.config
        state, running = self._running()
        stopped = TritonStatus(
            running=False,
            pid=None,
            live=False,
            ready=False,
            http_url=cfg.http_url,
            grpc_url=cfg.grpc_url,
            metrics_url=cfg.metrics_url,
            log_path=self.log_path,
            version=None,
            repository=cfg.repository,
            state_dir=cfg.state_dir,
            detail="not running",
        )
        if state is None:
            return stopped
        if running is None:
            return _with_detail(stopped, f"not running (stale pid file for pid {state.get('pid')})")
        host = state["client_host"]
        http_url = hostport(host, int(state["http_port"]))
        live, ready, version = probe(http_url)
        detail = "running" if live else "running, not live yet (starting or stuck: see log)"
        if not self._same_config(state):
            detail += "; started with a different configuration than this one"
        return replace(
            stopped,
            running=True,
            pid=int(state["pid"]),
            live=live,
            ready=ready,
            http_url=http_url,
            grpc_url=hostport(host, int(state["grpc_port"])),
            metrics_url=hostport(host, int(state["metrics_port"])),
            version=version,
            repository=repository_value(state["repository"]),
            detail=detail,
        )

    @property
    def control_key(self) -> str | None:
        """The key this server's model control requires: the configured one, else the repository's key file."""
        return self.config.control_key or read_control_key(self.config.repository)

    def control_headers(self, protocol: str = "grpc") -> dict[str, str] | None:
        """``headers=`` for a raw tritonclient load/unload/index call (``protocol`` ``grpc`` or ``http``)."""
        return control_headers(self.control_key, protocol)

    def log_tail(self, n: int = 50) -> str:
        """Last ``n`` lines of the server log (load errors end up here, with Python tracebacks)."""
        return tail(self.log_path, n)

    @property
    def http_url(self) -> str:
        return self.config.http_url

    @property
    def grpc_url(self) -> str:
        return self.config.grpc_url

    def __enter__(self) -> LocalTriton:
        self.start(wait=True)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._started_here:
            self.stop()

    # -- internals

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Serialise start/stop across processes sharing the state_dir (parallel Airflow tasks)."""
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        with (self.config.state_dir / LOCK_FILE).open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _read_state(self) -> dict[str, Any] | None:
        try:
            state = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            if self.pid_path.is_file():  # pid file without state: old/foreign, still worth reporting
                with contextlib.suppress(ValueError, OSError):
                    return {"pid": int(self.pid_path.read_text().strip())}
            return None
        except (OSError, ValueError):
            log.warning("unreadable %s; treating the server as not running", self.state_path)
            return None
        return state if isinstance(state, dict) and "pid" in state else None

    def _running(self) -> tuple[dict[str, Any] | None, psutil.Process | None]:
        """(state, process) — process only if the pid is still *our* tritonserver (not a reused pid)."""
        if self._proc is not None:
            self._proc.poll()  # reap our own child so it does not linger as a zombie
        state = self._read_state()
        if state is None:
            return None, None
        try:
            proc = psutil.Process(int(state["pid"]))
            same = (
                "create_time" in state
                and abs(proc.create_time() - float(state["create_time"])) < 0.5
                and proc.name().startswith("tritonserver")
            )
            if same and proc.status() != psutil.STATUS_ZOMBIE:
                return state, proc
        except (psutil.Error, ValueError, TypeError):
            pass
        return state, None

    def _same_config(self, state: dict[str, Any]) -> bool:
        cfg = self.config
        return (
            state.get("repository") == str(cfg.repository)
            and state.get("host") == cfg.host
            and state.get("http_port") == cfg.http_port
            and state.get("grpc_port") == cfg.grpc_port
            and state.get("metrics_port") == cfg.metrics_port
        )

    def _already_running(self, state: dict[str, Any], running: psutil.Process, wait: bool) -> TritonStatus:
        cfg = self.config
        if not self._same_config(state):
            raise ServingError(
                f"a tritonserver started by seqcls already runs from {cfg.state_dir} (pid {state['pid']}, "
                f"repository {state.get('repository')}, HTTP {state.get('http_port')}, gRPC "
                f"{state.get('grpc_port')}, metrics {state.get('metrics_port')}); it differs from the "
                f"requested one (repository {cfg.repository}, HTTP {cfg.http_port}, gRPC {cfg.grpc_port}, "
                f"metrics {cfg.metrics_port}). Stop it first (seqcls triton stop) or use another state_dir."
            )
        if state.get("options") != cfg.options():
            log.warning(
                "tritonserver pid %s was started with other options (%s); stop and start it to apply %s",
                state["pid"],
                state.get("options"),
                cfg.options(),
            )
        log.info("tritonserver already running (pid %s) with the same repository and ports", state["pid"])
        if wait:
            wait_until_live(cfg.http_url, cfg.startup_timeout, process=running, log_path=self.log_path)
        return _with_detail(self.status(), f"already running (pid {state['pid']})")

    def _rotate_log(self) -> None:
        if self.log_path.is_file() and self.log_path.stat().st_size:
            replace_file(self.log_path, self.log_path.with_name(LOG_FILE + ".1"))

    def _write_state(self, pid: int, shm_prefix: str, server_dir: Path, dist: TritonDistribution) -> None:
        cfg = self.config
        try:
            create_time = psutil.Process(pid).create_time()
        except psutil.Error:
            create_time = time.time()
        state = {
            "pid": pid,
            "create_time": create_time,
            "repository": str(cfg.repository),
            "host": cfg.host,
            "client_host": cfg.client_host,
            "http_port": cfg.http_port,
            "grpc_port": cfg.grpc_port,
            "metrics_port": cfg.metrics_port,
            "shm_prefix": shm_prefix,
            "server_dir": str(server_dir),
            "pytriton": dist.version,
            "options": cfg.options(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "started_by_pid": os.getpid(),
        }
        atomic_write(self.state_path, json.dumps(state, indent=2) + "\n")
        atomic_write(self.pid_path, f"{pid}\n")

    def _remove_state_files(self) -> None:
        for path in (self.pid_path, self.state_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _clean_stale(self, state: dict[str, Any] | None) -> None:
        """Forget a server that died without stop(): orphaned stubs, its shm regions, its files."""
        if state is None:
            return
        with contextlib.suppress(ValueError, TypeError):
            process.kill_orphaned_stubs(int(state["pid"]))
        process.remove_shm(state.get("shm_prefix"))
        self._remove_state_files()

    def _terminate(self, pid: int, shm_prefix: str | None, timeout: float) -> None:
        process.terminate(pid, shm_prefix, timeout, child=self._proc)


def _with_detail(status: TritonStatus, detail: str) -> TritonStatus:
    return replace(status, detail=detail)
