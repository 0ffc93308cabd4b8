"""Run a real local Triton Inference Server, started and stopped by seqcls itself.

The ``tritonserver`` binary comes from the nvidia-pytriton wheel (Triton 2.51 with the python
backend only), so a plain ``pip install`` is all a developer machine or Airflow worker needs.
We do not use pytriton's own launcher: it ties the server's life to the Python process (which
would kill it when ``seqcls triton start`` or an Airflow task exits) and always loads its own
proxy models. Instead the server runs in its own session, detached from the caller, with its
pid, state and log in ``state_dir`` (``Settings.triton_dir``), so a later process (CLI, another
Airflow task) can find, query and stop it.

Choices that matter when reading the code:

* The wheel's binaries find their libraries through an RPATH relative to site-packages, and
  the python backend needs the stub matching this interpreter in ``backends/python``. We copy
  the distribution once per pytriton/Python version into ``state_dir`` (atomically) and point
  ``LD_LIBRARY_PATH`` at the wheel's ``nvidia_pytriton.libs`` plus this interpreter's libpython.
* The stub ignores ``PYTHONPATH``: its embedded interpreter locates its environment from the
  first ``python3`` on ``PATH``, so this interpreter's ``bin`` directory goes first on ``PATH``.
  The stub puts ``""`` (its cwd), the model's version dir (``<model>/1``) and the model dir on
  ``sys.path``; the server runs with ``cwd=state_dir`` so no stray module from wherever the
  CLI was launched can shadow a model's imports.
* Explicit model control: nothing loads at start; the publish step loads models one by one.
* ``--strict-readiness=false``: with the default (true) a single failed ``load_model`` makes
  ``/v2/health/ready`` false for the rest of the server's life, even after the broken model is
  unloaded. Readiness of what we serve is always checked per model (``is_model_ready``);
  server readiness then only means "accepting requests".
* Loopback only by default: the model-control API (load/unload) has no authentication.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import dataclasses
import errno
import fcntl
import importlib.metadata
import importlib.util
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import psutil

from seqcls.errors import InputError, ServingError
from seqcls.settings import Settings, default_home

log = logging.getLogger(__name__)

PYTRITON_DISTRIBUTION = "nvidia-pytriton"
PYTRITON_PIN = "nvidia-pytriton==0.7.0"  # same pin as requirements.txt

#: Python backend shared memory (``/dev/shm``) per model instance. Triton 2.51's own default is
#: 1 MiB/1 MiB; our tensors (token ids, logits, a few strings) are far smaller than 4 MiB, and
#: 4 MiB growth steps keep a rare large batch from growing the region in many small steps.
#: Docker's default /dev/shm is 64 MiB, so a handful of instances still fit.
DEFAULT_SHM_DEFAULT_BYTE_SIZE = 4 * 1024 * 1024
DEFAULT_SHM_GROWTH_BYTE_SIZE = 4 * 1024 * 1024
#: Seconds Triton waits for in-flight requests on SIGTERM before it exits anyway.
DEFAULT_EXIT_TIMEOUT = 10
DEFAULT_STOP_TIMEOUT = 30.0

PID_FILE = "tritonserver.pid"
STATE_FILE = "tritonserver.json"
LOG_FILE = "tritonserver.log"
LOCK_FILE = "tritonserver.lock"
_PREPARED_MARKER = ".seqcls-prepared.json"
_SHM_DIR = Path("/dev/shm")
_SHM_PREFIX_RE = re.compile(r"^seqcls-[0-9a-f]{8}-$")

#: Flags seqcls sets itself; passing them in ``extra_args`` would desynchronise status/stop.
_MANAGED_FLAGS = (
    "--model-repository",
    "--model-store",
    "--model-control-mode",
    "--backend-directory",
    "--http-port",
    "--grpc-port",
    "--metrics-port",
    "--http-address",
    "--grpc-address",
    "--metrics-address",
    "--allow-http",  # liveness/status go over HTTP
    "--allow-grpc",  # load/unload and smoke tests go over gRPC
)


# ----------------------------------------------------------------------------- configuration


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_int(value: object, *, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _same_host(host: str) -> str:
    return "127.0.0.1" if host == "localhost" else host


def _hostport(host: str, port: int) -> str:
    """``host:port`` the way tritonclient wants its ``url`` (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_endpoint(value: str) -> tuple[str, int]:
    """Split a Settings endpoint (``host:port`` or ``[v6]:port``)."""
    text = value.strip()
    for scheme in ("http://", "https://", "grpc://"):
        if text.startswith(scheme):
            text = text[len(scheme) :]
    text = text.rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InputError(f"Triton endpoint {value!r} is not host:port (example: 127.0.0.1:8001)")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class TritonServerConfig:
    """How to run one local Triton; validated up front so a typo fails before any process starts."""

    repository: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    #: pid/state/log files and the prepared server copy; one server per state_dir.
    state_dir: Path = field(default_factory=lambda: default_home() / "triton")
    log_verbose: int = 0
    extra_args: tuple[str, ...] = ()
    startup_timeout: float = 60.0
    #: Bind a non-loopback host. Off by default: load/unload is unauthenticated.
    allow_remote: bool = False
    shm_default_byte_size: int = DEFAULT_SHM_DEFAULT_BYTE_SIZE
    shm_growth_byte_size: int = DEFAULT_SHM_GROWTH_BYTE_SIZE
    exit_timeout: int = DEFAULT_EXIT_TIMEOUT

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "repository", Path(self.repository).expanduser().resolve())
        set_(self, "state_dir", Path(self.state_dir).expanduser().resolve())
        ports = {"http_port": self.http_port, "grpc_port": self.grpc_port, "metrics_port": self.metrics_port}
        for name, port in ports.items():
            if not _is_int(port, minimum=1) or port > 65535:
                raise InputError(f"Triton {name}={port!r} is not a TCP port: use an integer in 1..65535")
        if len(set(ports.values())) != len(ports):
            raise InputError(
                f"Triton ports must differ: http={self.http_port} grpc={self.grpc_port} metrics={self.metrics_port}"
            )
        # localhost -> 127.0.0.1: one address family, so the port check and Triton agree.
        host = _same_host(str(self.host).strip().strip("[]"))
        if not host:
            raise InputError("Triton host is empty: use 127.0.0.1")
        if not self.allow_remote and not _is_loopback(host):
            raise InputError(
                f"Triton host {host!r} is not a loopback address. The model-control API "
                "(load/unload) is unauthenticated, so seqcls binds 127.0.0.1 unless "
                "allow_remote=True is passed deliberately."
            )
        set_(self, "host", host)
        if isinstance(self.extra_args, str) or not all(isinstance(a, str) for a in self.extra_args):
            raise InputError(f"extra_args must be a sequence of strings, got {self.extra_args!r}")
        set_(self, "extra_args", tuple(self.extra_args))
        for arg in self.extra_args:
            flag = arg.split("=", 1)[0]
            if flag in _MANAGED_FLAGS:
                raise InputError(f"extra_args may not set {flag}: seqcls sets or relies on it (see the config fields)")
        if not _is_int(self.log_verbose, minimum=0):
            raise InputError(f"log_verbose={self.log_verbose!r} must be an integer >= 0")
        if not self.startup_timeout > 0:
            raise InputError(f"startup_timeout={self.startup_timeout!r} must be > 0 seconds")
        for name in ("shm_default_byte_size", "shm_growth_byte_size"):
            value = getattr(self, name)
            if not _is_int(value, minimum=1):
                raise InputError(f"{name}={value!r} must be a positive number of bytes")
        if not _is_int(self.exit_timeout, minimum=0):
            raise InputError(f"exit_timeout={self.exit_timeout!r} must be an integer >= 0 seconds")

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> TritonServerConfig:
        """Config for the live repository and the first configured endpoints; non-None overrides win."""
        http_host, http_port = _parse_endpoint(settings.triton_http[0])
        grpc_host, grpc_port = _parse_endpoint(settings.triton_grpc[0])
        values: dict[str, Any] = {
            "repository": settings.triton_repository,
            "state_dir": settings.triton_dir,
            "http_port": http_port,
            "grpc_port": grpc_port,
            # Triton's convention (8000 → 8002) also for custom ports, so two local servers on
            # different endpoints never fight over the default metrics port.
            "metrics_port": http_port + 2 if http_port + 2 != grpc_port else http_port + 3,
            "host": http_host,
        }
        known = {f.name for f in fields(cls)}
        for key, value in overrides.items():
            if key not in known:
                raise TypeError(f"unknown TritonServerConfig field {key!r}")
            if value is not None:
                values[key] = value
        if "host" not in overrides or overrides["host"] is None:
            if _same_host(http_host) != _same_host(grpc_host):
                raise InputError(
                    f"Triton HTTP ({settings.triton_http[0]}) and gRPC ({settings.triton_grpc[0]}) "
                    "endpoints name different hosts; a local server binds one host for both."
                )
            if not values.get("allow_remote") and not _is_loopback(http_host):
                raise InputError(
                    f"the configured Triton endpoints ({settings.triton_http[0]}, "
                    f"{settings.triton_grpc[0]}) are not on this machine; a local server only runs "
                    "on loopback. Start Triton on that host, or point SEQCLS_TRITON_HTTP/GRPC at "
                    "127.0.0.1:<port> to run it here."
                )
        if len(settings.triton_http) > 1 or len(settings.triton_grpc) > 1:
            log.debug("several Triton endpoints configured; the local server uses the first ones")
        return cls(**values)

    @property
    def client_host(self) -> str:
        """Where a local client reaches the server (wildcard binds are reached on loopback)."""
        if self.host in ("0.0.0.0", ""):
            return "127.0.0.1"
        if self.host == "::":
            return "::1"
        return self.host

    @property
    def http_url(self) -> str:
        return _hostport(self.client_host, self.http_port)

    @property
    def grpc_url(self) -> str:
        return _hostport(self.client_host, self.grpc_port)

    @property
    def metrics_url(self) -> str:
        return _hostport(self.client_host, self.metrics_port)


# ----------------------------------------------------------------------------- distribution


@dataclass(frozen=True)
class TritonDistribution:
    """Where the pytriton wheel keeps the server, its libraries and the per-Python stubs."""

    version: str
    source_dir: Path  # site-packages/pytriton/tritonserver
    libs_dir: Path  # site-packages/nvidia_pytriton.libs
    python_version: str = f"{sys.version_info.major}.{sys.version_info.minor}"

    @property
    def binary(self) -> Path:
        return self.source_dir / "bin" / "tritonserver"

    @property
    def stub(self) -> Path:
        return self.source_dir / "python_backend_stubs" / self.python_version / "triton_python_backend_stub"

    @classmethod
    def locate(cls, pytriton_root: Path | None = None) -> TritonDistribution:
        """Find the wheel's server without importing pytriton (its import pulls in a lot)."""
        install = f"{sys.executable} -m pip install '{PYTRITON_PIN}'"
        if pytriton_root is None:
            spec = importlib.util.find_spec("pytriton")
            if spec is None or not spec.submodule_search_locations:
                raise ServingError(
                    f"nvidia-pytriton is not installed for {sys.executable}, so there is no "
                    f"tritonserver binary to run. Install it: {install}"
                )
            pytriton_root = Path(next(iter(spec.submodule_search_locations)))
        pytriton_root = Path(pytriton_root)
        try:
            version = importlib.metadata.version(PYTRITON_DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        dist = cls(
            version=version,
            source_dir=pytriton_root / "tritonserver",
            libs_dir=pytriton_root.parent / "nvidia_pytriton.libs",
        )
        if not dist.binary.is_file():
            raise ServingError(
                f"tritonserver binary not found at {dist.binary}: the nvidia-pytriton install is "
                f"missing or incomplete (an editable/source checkout ships no server). Install the "
                f"wheel: {install}"
            )
        if not dist.libs_dir.is_dir():
            raise ServingError(
                f"{dist.libs_dir} (tritonserver's bundled libraries) is missing; reinstall: "
                f"{sys.executable} -m pip install --force-reinstall '{PYTRITON_PIN}'"
            )
        if not dist.stub.is_file():
            available = sorted(p.name for p in (dist.source_dir / "python_backend_stubs").glob("*"))
            raise ServingError(
                f"nvidia-pytriton {version} has no python backend stub for Python "
                f"{dist.python_version} (it has: {', '.join(available) or 'none'}); run seqcls with "
                "one of those Python versions."
            )
        return dist


def find_libpython(libdir: Path | None = None, *, search_system: bool = True) -> Path:
    """The libpython the python backend stub will load; it must match this interpreter's minor."""
    major, minor = sys.version_info[:2]
    soname = f"libpython{major}.{minor}.so.1.0"
    libdir = Path(libdir if libdir is not None else (sysconfig.get_config_var("LIBDIR") or sys.prefix))
    if (libdir / soname).exists():
        return libdir / soname
    if search_system:
        for entry in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
            if entry and (Path(entry) / soname).exists():
                return Path(entry) / soname
        found = ctypes.util.find_library(f"python{major}.{minor}")
        if found:
            return Path(found)
    raise ServingError(
        f"{soname} (shared Python library) not found, and the Triton python backend stub needs it. "
        f"Install libpython{major}.{minor} (Debian/Ubuntu: apt-get install libpython{major}.{minor}; "
        f"pyenv: rebuild with PYTHON_CONFIGURE_OPTS=--enable-shared)."
    )


def prepare_server(dist: TritonDistribution, state_dir: Path) -> Path:
    """A runnable copy of the server with this Python's stub in place; made once, reused after.

    Built in a temp dir and renamed into place, so concurrent starters (two Airflow tasks) never
    see a half-copied tree.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    target = state_dir / f"server-{dist.version}-py{dist.python_version}"
    if (target / _PREPARED_MARKER).is_file():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=".server-tmp-", dir=state_dir))
    try:
        tree = tmp / "tritonserver"
        shutil.copytree(
            dist.source_dir,
            tree,
            ignore=shutil.ignore_patterns("python_backend_stubs", "__pycache__"),
        )
        stub = tree / "backends" / "python" / "triton_python_backend_stub"
        shutil.copy2(dist.stub, stub)
        stub.chmod(0o755)
        marker = {"pytriton": dist.version, "python": dist.python_version, "source": str(dist.source_dir)}
        (tree / _PREPARED_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if target.exists():  # left over without marker: never completed, replace it
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(tree, target)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not (target / _PREPARED_MARKER).is_file():
                raise
            log.debug("another process prepared %s first", target)
        else:
            log.info("prepared tritonserver %s (py%s stub) in %s", dist.version, dist.python_version, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# ----------------------------------------------------------------------------- helpers


def free_ports(n: int, host: str = "127.0.0.1") -> tuple[int, ...]:
    """``n`` distinct ports free right now (held open together so they cannot repeat)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(family, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return tuple(s.getsockname()[1] for s in socks)
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now (for tests; another process may still take it before you bind)."""
    return free_ports(1, host)[0]


def _port_owner(port: int) -> str:
    """Best effort 'pid N (name)' of the listener; empty when unknown or not permitted."""
    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                try:
                    return f" by pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                except psutil.Error:
                    return f" by pid {conn.pid}"
    except (psutil.Error, OSError):
        pass
    return ""


def _check_ports_free(config: TritonServerConfig) -> None:
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    services = (("HTTP", config.http_port), ("gRPC", config.grpc_port), ("metrics", config.metrics_port))
    for service, port in services:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            # Same option servers use, so a port in TIME_WAIT is not reported as busy.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((config.host, port))
            except OSError as exc:
                raise ServingError(
                    f"port {port} (Triton {service}) on {config.host} is already in use"
                    f"{_port_owner(port)}: stop that process or choose another {service} port"
                    f" ({exc.strerror})."
                ) from exc


def _tail(path: Path, n: int) -> str:
    """Last ``n`` lines of a possibly large log without reading all of it."""
    if n <= 0 or not path.is_file():
        return ""
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        end = f.tell()
        block, data = 8192, b""
        pos = end
        while pos > 0 and data.count(b"\n") <= n:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-n:])


def _process_alive(process: subprocess.Popen[bytes] | psutil.Process) -> bool:
    if isinstance(process, subprocess.Popen):
        return process.poll() is None
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _exit_code(process: subprocess.Popen[bytes] | psutil.Process) -> str:
    if isinstance(process, subprocess.Popen):
        return str(process.returncode)
    return "unknown (not our child)"


#: Log lines worth quoting when startup fails (Triton's E-lines, getopt complaints).
_SALIENT_RE = re.compile(r"^E\d{4} |unrecognized option|invalid argument|error:|failed to", re.IGNORECASE)
#: Printed on every CPU-only host; not the reason anything failed.
_NOISE_RE = re.compile(r"CudaDriverHelper|CUDA driver version is insufficient|pinned memory pool")


def _startup_failure_summary(log_path: Path | None) -> str:
    """Why startup failed, from the log: salient lines first (a bad flag is followed by ~400
    lines of usage text), then the tail; plus a port hint for a busy port."""
    if log_path is None or not log_path.is_file():
        return ""
    with log_path.open("rb") as f:
        head = f.read(1 << 20).decode("utf-8", errors="replace").splitlines()
    salient = [ln for ln in head if _SALIENT_RE.search(ln) and not _NOISE_RE.search(ln)][:10]
    text = ""
    match = re.search(r"Socket '([^']+)' already in use", "\n".join(head))
    if match:
        text += f" (port {match.group(1).rsplit(':', 1)[-1]} is already in use)"
    text += f"; log {log_path}"
    if salient:
        text += ", errors:\n" + "\n".join(salient) + "\nlast lines:\n" + _tail(log_path, 10)
    else:
        text += ", last lines:\n" + _tail(log_path, 30)
    return text


def wait_until_live(
    http_url: str,
    timeout: float = 60.0,
    *,
    process: subprocess.Popen[bytes] | psutil.Process | None = None,
    log_path: Path | None = None,
    interval: float = 0.1,
) -> float:
    """Poll ``/v2/health/live`` until it answers; returns seconds waited.

    Fails fast, with the log tail, when ``process`` exits meanwhile: a server that died on a bad
    flag or a busy port should not cost the full timeout.
    """
    import tritonclient.http as httpclient  # lazy: keeps `import seqcls` cheap for DAG parsing

    start = time.monotonic()
    deadline = start + timeout
    client = httpclient.InferenceServerClient(url=http_url, connection_timeout=1.0, network_timeout=2.0)
    try:
        while True:
            if process is not None and not _process_alive(process):
                raise ServingError(
                    f"tritonserver exited with code {_exit_code(process)} during startup"
                    + _startup_failure_summary(log_path)
                )
            try:
                if client.is_server_live():
                    return time.monotonic() - start
            except Exception:  # connection refused/reset while it starts: keep polling
                pass
            if time.monotonic() >= deadline:
                raise ServingError(
                    f"Triton at {http_url} was not live after {timeout:g} s" + _startup_failure_summary(log_path)
                )
            time.sleep(interval)
    finally:
        client.close()


# ----------------------------------------------------------------------------- server


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
    repository: Path
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
            state, process = self._running()
            if state is not None and process is not None:
                return self._already_running(state, process, wait)
            self._clean_stale(state)

            dist = self._distribution or TritonDistribution.locate()
            libpython = find_libpython()
            _check_ports_free(cfg)
            if cfg.repository.exists() and not cfg.repository.is_dir():
                raise InputError(f"Triton model repository {cfg.repository} is a file, not a directory")
            if not cfg.repository.exists():
                cfg.repository.mkdir(parents=True)
                log.info("created empty model repository %s", cfg.repository)
            server_dir = prepare_server(dist, cfg.state_dir)
            self._warn_low_shm()

            shm_prefix = f"seqcls-{secrets.token_hex(4)}-"
            cmd = self._command(server_dir, shm_prefix)
            env = self._environment(dist, libpython)
            self._rotate_log()
            log.info("starting tritonserver %s: HTTP %s, gRPC %s", dist.version, cfg.http_url, cfg.grpc_url)
            log.debug("tritonserver command: %s", " ".join(cmd))
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
                ) from exc
            self._proc = proc
            self._started_here = True
            self._write_state(proc.pid, shm_prefix, server_dir, dist)
            if not wait:
                return self.status()
            try:
                wait_until_live(cfg.http_url, cfg.startup_timeout, process=proc, log_path=self.log_path)
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
            state, process = self._running()
            if state is None:
                log.info("tritonserver (state %s) is not running", self.config.state_dir)
                return
            if process is None:
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
        state, process = self._running()
        if state is None or process is None:
            detail = "not running"
            if state is not None:
                detail += f" (stale pid file for pid {state.get('pid')})"
            return TritonStatus(
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
                detail=detail,
            )
        host = state["client_host"]
        http_url = _hostport(host, int(state["http_port"]))
        live, ready, version = _probe(http_url)
        detail = "running" if live else "running, not live yet (starting or stuck: see log)"
        if not self._same_config(state):
            detail += "; started with a different configuration than this one"
        return TritonStatus(
            running=True,
            pid=int(state["pid"]),
            live=live,
            ready=ready,
            http_url=http_url,
            grpc_url=_hostport(host, int(state["grpc_port"])),
            metrics_url=_hostport(host, int(state["metrics_port"])),
            log_path=self.log_path,
            version=version,
            repository=Path(state["repository"]),
            state_dir=cfg.state_dir,
            detail=detail,
        )

    def log_tail(self, n: int = 50) -> str:
        """Last ``n`` lines of the server log (load errors end up here, with Python tracebacks)."""
        return _tail(self.log_path, n)

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

    def _already_running(self, state: dict[str, Any], process: psutil.Process, wait: bool) -> TritonStatus:
        cfg = self.config
        if not self._same_config(state):
            raise ServingError(
                f"a tritonserver started by seqcls already runs from {cfg.state_dir} (pid {state['pid']}, "
                f"repository {state.get('repository')}, HTTP {state.get('http_port')}, gRPC "
                f"{state.get('grpc_port')}, metrics {state.get('metrics_port')}); it differs from the "
                f"requested one (repository {cfg.repository}, HTTP {cfg.http_port}, gRPC {cfg.grpc_port}, "
                f"metrics {cfg.metrics_port}). Stop it first (seqcls triton stop) or use another state_dir."
            )
        if state.get("options") != self._options():
            log.warning(
                "tritonserver pid %s was started with other options (%s); stop and start it to apply %s",
                state["pid"],
                state.get("options"),
                self._options(),
            )
        log.info("tritonserver already running (pid %s) with the same repository and ports", state["pid"])
        if wait:
            wait_until_live(cfg.http_url, cfg.startup_timeout, process=process, log_path=self.log_path)
        return _with_detail(self.status(), f"already running (pid {state['pid']})")

    def _options(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "log_verbose": cfg.log_verbose,
            "extra_args": list(cfg.extra_args),
            "shm_default_byte_size": cfg.shm_default_byte_size,
            "shm_growth_byte_size": cfg.shm_growth_byte_size,
            "exit_timeout": cfg.exit_timeout,
        }

    def _command(self, server_dir: Path, shm_prefix: str) -> list[str]:
        cfg = self.config
        return [
            str(server_dir / "bin" / "tritonserver"),
            f"--model-repository={cfg.repository}",
            "--model-control-mode=explicit",
            f"--backend-directory={server_dir / 'backends'}",
            f"--cache-directory={server_dir / 'caches'}",
            # See the module docstring: one failed load must not poison server readiness.
            "--strict-readiness=false",
            f"--http-address={cfg.host}",
            f"--http-port={cfg.http_port}",
            f"--grpc-address={cfg.host}",
            f"--grpc-port={cfg.grpc_port}",
            f"--metrics-address={cfg.host}",
            f"--metrics-port={cfg.metrics_port}",
            "--allow-gpu-metrics=false",  # no DCGM probing on CPU hosts; CPU metrics stay on
            f"--exit-timeout-secs={cfg.exit_timeout}",
            f"--log-verbose={cfg.log_verbose}",
            f"--backend-config=python,shm-default-byte-size={cfg.shm_default_byte_size}",
            f"--backend-config=python,shm-growth-byte-size={cfg.shm_growth_byte_size}",
            # Our own prefix lets stop() remove regions a SIGKILLed server leaves in /dev/shm.
            f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
            *cfg.extra_args,
        ]

    @staticmethod
    def _environment(dist: TritonDistribution, libpython: Path) -> dict[str, str]:
        env = dict(os.environ)
        bin_dir = Path(sys.executable).parent
        if not (bin_dir / "python3").exists():
            log.warning(
                "no python3 next to %s: the python backend stub will use the first python3 on PATH "
                "and may not see this environment's packages",
                sys.executable,
            )
        # libpython of *this* interpreter first, so the stub's embedded Python matches its stdlib.
        lib_path = [str(dist.libs_dir)]
        if libpython.is_absolute():  # find_library may return a bare soname (ld cache): no dir needed
            lib_path.append(str(libpython.parent))
        if env.get("LD_LIBRARY_PATH"):
            lib_path.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_path)
        env["PATH"] = os.pathsep.join(p for p in (str(bin_dir), env.get("PATH", "")) if p)
        env.pop("PYTHONHOME", None)  # would point the stub's interpreter at another installation
        return env

    def _rotate_log(self) -> None:
        if self.log_path.is_file() and self.log_path.stat().st_size:
            os.replace(self.log_path, self.log_path.with_name(LOG_FILE + ".1"))

    @staticmethod
    def _warn_low_shm() -> None:
        with contextlib.suppress(OSError):
            free = shutil.disk_usage(_SHM_DIR).free
            if free < 64 * 1024 * 1024:
                log.warning(
                    "only %d MiB free in /dev/shm; the python backend needs shared memory per model "
                    "instance (docker: --shm-size=1g)",
                    free // (1024 * 1024),
                )

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
            "options": self._options(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "started_by_pid": os.getpid(),
        }
        _atomic_write(self.state_path, json.dumps(state, indent=2) + "\n")
        _atomic_write(self.pid_path, f"{pid}\n")

    def _remove_state_files(self) -> None:
        for path in (self.pid_path, self.state_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _clean_stale(self, state: dict[str, Any] | None) -> None:
        """Forget a server that died without stop(): orphaned stubs, its shm regions, its files."""
        if state is None:
            return
        killed: list[psutil.Process] = []
        with contextlib.suppress(ValueError, TypeError):
            for p in _group_members(int(state["pid"])):  # stubs keep the dead server's pgid
                with contextlib.suppress(psutil.Error):
                    if "triton_python_backend_stub" in " ".join(p.cmdline()):
                        log.warning("killing orphaned python backend stub pid %d", p.pid)
                        p.kill()
                        killed.append(p)
        _wait_gone(killed, timeout=5.0)
        _remove_shm(state.get("shm_prefix"))
        self._remove_state_files()

    def _terminate(self, pid: int, shm_prefix: str | None, timeout: float) -> None:
        """Stop the whole process group: the server and every python backend stub it spawned."""
        try:
            root = psutil.Process(pid)
            members = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            members = []
        pgid = _pgid(pid)
        members += [p for p in _group_members(pgid) if p not in members]
        _signal(pid, pgid, signal.SIGTERM)
        alive = self._wait(members, timeout)
        if alive:
            log.warning(
                "tritonserver pid %d did not exit within %.0f s; sending SIGKILL to %d process(es)",
                pid,
                timeout,
                len(alive),
            )
            _signal(pid, pgid, signal.SIGKILL)
            for p in alive:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            alive = self._wait(alive, 5.0)
        # Anything still in the group (a stub spawned mid-shutdown) goes too.
        leftovers = [p for p in _group_members(pgid) if p.is_running()]
        for p in leftovers:
            with contextlib.suppress(psutil.Error):
                p.kill()
        alive = self._wait(alive + leftovers, 5.0)
        if alive:
            raise ServingError(f"could not stop tritonserver processes {[p.pid for p in alive]}")
        _remove_shm(shm_prefix)

    def _wait(self, procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
        """Wait for ``procs`` to exit; reaps our own Popen child through Popen so it keeps its code."""
        deadline = time.monotonic() + max(timeout, 0.0)
        if self._proc is not None:
            for p in procs:
                if p.pid == self._proc.pid:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        return _wait_gone(procs, max(deadline - time.monotonic(), 0.0))


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until ``procs`` exit; returns those still alive. A zombie counts as gone: orphans are
    reaped by init whenever it gets to it, which can take seconds in some containers."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if _process_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _process_alive(p)]
    return alive


def _with_detail(status: TritonStatus, detail: str) -> TritonStatus:
    return dataclasses.replace(status, detail=detail)


def _probe(http_url: str) -> tuple[bool, bool, str | None]:
    """(live, ready, version) over HTTP with short timeouts; False/None on any error."""
    import tritonclient.http as httpclient

    live = ready = False
    version: str | None = None
    client = httpclient.InferenceServerClient(url=http_url, connection_timeout=1.0, network_timeout=2.0)
    try:
        with contextlib.suppress(Exception):
            live = bool(client.is_server_live())
        if live:
            with contextlib.suppress(Exception):
                ready = bool(client.is_server_ready())
            with contextlib.suppress(Exception):
                version = str(client.get_server_metadata().get("version")) or None
    finally:
        client.close()
    return live, ready, version


def _pgid(pid: int) -> int | None:
    """The server's own process group (it is a session leader); None if that is not the case."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return None
    return pgid if pgid == pid else None  # never signal a group we do not own (e.g. the caller's)


def _group_members(pgid: int | None) -> list[psutil.Process]:
    if pgid is None:
        return []
    members = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if os.getpgid(p.pid) == pgid:
                members.append(p)
    return members


def _signal(pid: int, pgid: int | None, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if pgid is not None:
            os.killpg(pgid, sig)
        else:
            os.kill(pid, sig)


def _remove_shm(prefix: str | None) -> None:
    """Remove python-backend regions a killed server left behind (only our own prefix)."""
    if not prefix or not _SHM_PREFIX_RE.match(prefix) or not _SHM_DIR.is_dir():
        return
    for path in _SHM_DIR.glob(prefix + "*"):
        with contextlib.suppress(OSError):
            path.unlink()
            log.debug("removed leftover shared memory %s", path)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


__all__ = [
    "DEFAULT_SHM_DEFAULT_BYTE_SIZE",
    "DEFAULT_SHM_GROWTH_BYTE_SIZE",
    "LocalTriton",
    "TritonDistribution",
    "TritonServerConfig",
    "TritonStatus",
    "find_libpython",
    "free_port",
    "free_ports",
    "prepare_server",
    "wait_until_live",
]
