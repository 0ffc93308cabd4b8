"""How one local Triton runs: ports, bind host, server options — validated before any process starts.

Choices that matter when reading the command line (:meth:`TritonServerConfig.command`):

* Explicit model control: nothing loads at start; the publish step loads models one by one.
* ``--strict-readiness=false``: with the default (true) a single failed ``load_model`` makes
  ``/v2/health/ready`` false for the rest of the server's life, even after the broken model is
  unloaded. Readiness of what we serve is always checked per model (``is_model_ready``);
  server readiness then only means "accepting requests".
* ``--disable-auto-complete-config``: seqcls renders every ``config.pbtxt`` complete, and with
  auto-complete on, the python backend starts one extra stub per model load just to ask
  ``model.py`` for a config (≈ 1.2 s of every load of the medium model's three python models).
* Model control needs the control key: load/unload/repository index (and shared memory, trace,
  logging) are restricted to callers sending it (:mod:`~seqcls.localtriton.keys`); health,
  metadata and inference stay open.
* Loopback only by default, all the same: the key travels in clear text (no TLS), so a
  non-loopback host needs ``allow_remote=True``.
* Flags seqcls sets itself (repository, control mode, ports, addresses) may not be passed again
  in ``extra_args``: status and stop rely on them.
* The repository is a directory, or an object store in Triton's own form (``s3://host:port/bucket/prefix``;
  built by :func:`seqcls.serving.s3repo.triton_repository`). Its credentials go into the server's
  environment (``environment``), never onto its command line, into the state file or a log line; such a
  server needs an explicit ``control_key`` (the key file lives in a POSIX repository's root).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from seqcls.errors import InputError
from seqcls.localtriton.keys import RESTRICTED_FLAGS, restricted_flags
from seqcls.settings import Settings, check_control_key, default_home

log = logging.getLogger(__name__)

#: Python backend shared memory (``/dev/shm``) per model instance. Triton 2.51's own default is
#: 1 MiB/1 MiB; our tensors (token ids, logits, a few strings) are far smaller than 4 MiB, and
#: 4 MiB growth steps keep a rare large batch from growing the region in many small steps.
#: Docker's default /dev/shm is 64 MiB, so a handful of instances still fit.
DEFAULT_SHM_DEFAULT_BYTE_SIZE = 4 * 1024 * 1024
DEFAULT_SHM_GROWTH_BYTE_SIZE = 4 * 1024 * 1024
#: Seconds Triton waits for in-flight requests on SIGTERM before it exits anyway.
DEFAULT_EXIT_TIMEOUT = 10

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
    *RESTRICTED_FLAGS,  # the control key (control_key / the repository's key file)
)


#: Repository URIs the local server takes (Triton's S3 file system is built into the wheel's server).
OBJECT_STORE_SCHEMES = ("s3://",)


def repository_value(value: Path | str) -> Path | str:
    """A repository as the config holds it: an object-store URI stays a string (``Path`` would turn
    ``s3://b`` into ``s3:/b``); anything else is a resolved directory path."""
    text = str(value)
    if isinstance(value, str) and "://" in text:
        if not text.startswith(OBJECT_STORE_SCHEMES) or len(text) <= len("s3://"):
            raise InputError(
                f"Triton repository {text!r}: a local server takes a directory or s3://[host:port/]bucket/prefix"
            )
        return text.rstrip("/")
    return Path(value).expanduser().resolve()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_int(value: object, *, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def same_host(host: str) -> str:
    return "127.0.0.1" if host == "localhost" else host


def hostport(host: str, port: int) -> str:
    """``host:port`` the way tritonclient wants its ``url`` (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_endpoint(value: str) -> tuple[str, int]:
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

    #: A directory, or an object store's URI in Triton's form (see the module docstring).
    repository: Path | str
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    #: pid/state/log files and the prepared server copy; one server per state_dir.
    state_dir: Path = field(default_factory=lambda: default_home() / "triton")
    log_verbose: int = 0
    extra_args: tuple[str, ...] = ()
    startup_timeout: float = 60.0
    #: Bind a non-loopback host. Off by default: the control key travels unencrypted.
    allow_remote: bool = False
    shm_default_byte_size: int = DEFAULT_SHM_DEFAULT_BYTE_SIZE
    shm_growth_byte_size: int = DEFAULT_SHM_GROWTH_BYTE_SIZE
    exit_timeout: int = DEFAULT_EXIT_TIMEOUT
    #: The model-control key; None = the repository's key file (generated on first start).
    control_key: str | None = field(default=None, repr=False)
    #: Variables added to the server's environment only (an object store's credentials): never logged.
    environment: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "repository", repository_value(self.repository))
        set_(self, "environment", dict(self.environment))
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.environment.items()):
            raise InputError("environment must map variable names to strings")
        if self.remote and self.control_key is None:
            raise InputError(
                f"Triton repository {self.repository}: an object-store repository has no control key file; "
                "pass control_key (SEQCLS_TRITON_CONTROL_KEY)"
            )
        set_(self, "state_dir", Path(self.state_dir).expanduser().resolve())
        self._check_ports()
        # localhost -> 127.0.0.1: one address family, so the port check and Triton agree.
        host = same_host(str(self.host).strip().strip("[]"))
        if not host:
            raise InputError("Triton host is empty: use 127.0.0.1")
        if not self.allow_remote and not is_loopback(host):
            raise InputError(
                f"Triton host {host!r} is not a loopback address. The model-control key travels "
                "unencrypted (no TLS), so seqcls binds 127.0.0.1 unless allow_remote=True is passed "
                "deliberately."
            )
        set_(self, "host", host)
        if isinstance(self.extra_args, str) or not all(isinstance(a, str) for a in self.extra_args):
            raise InputError(f"extra_args must be a sequence of strings, got {self.extra_args!r}")
        set_(self, "extra_args", tuple(self.extra_args))
        for arg in self.extra_args:
            flag = arg.split("=", 1)[0]
            if flag in _MANAGED_FLAGS:
                raise InputError(f"extra_args may not set {flag}: seqcls sets or relies on it (see the config fields)")
        self._check_options()

    def _check_ports(self) -> None:
        ports = {"http_port": self.http_port, "grpc_port": self.grpc_port, "metrics_port": self.metrics_port}
        for name, port in ports.items():
            if not _is_int(port, minimum=1) or port > 65535:
                raise InputError(f"Triton {name}={port!r} is not a TCP port: use an integer in 1..65535")
        if len(set(ports.values())) != len(ports):
            raise InputError(
                f"Triton ports must differ: http={self.http_port} grpc={self.grpc_port} metrics={self.metrics_port}"
            )

    def _check_options(self) -> None:
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
        if self.control_key is not None:
            check_control_key(self.control_key, "control_key")

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> TritonServerConfig:
        """Config for the live repository and the first configured endpoints; non-None overrides win."""
        http_host, http_port = parse_endpoint(settings.triton_http[0])
        grpc_host, grpc_port = parse_endpoint(settings.triton_grpc[0])
        values: dict[str, Any] = {
            "repository": settings.triton_repository,
            "state_dir": settings.triton_dir,
            "http_port": http_port,
            "grpc_port": grpc_port,
            # Triton's convention (8000 → 8002) also for custom ports, so two local servers on
            # different endpoints never fight over the default metrics port.
            "metrics_port": http_port + 2 if http_port + 2 != grpc_port else http_port + 3,
            "host": http_host,
            "control_key": settings.triton_control_key,  # explicit only; None = the repository's key file
        }
        known = {f.name for f in fields(cls)}
        for key, value in overrides.items():
            if key not in known:
                raise TypeError(f"unknown TritonServerConfig field {key!r}")
            if value is not None:
                values[key] = value
        if "host" not in overrides or overrides["host"] is None:
            if same_host(http_host) != same_host(grpc_host):
                raise InputError(
                    f"Triton HTTP ({settings.triton_http[0]}) and gRPC ({settings.triton_grpc[0]}) "
                    "endpoints name different hosts; a local server binds one host for both."
                )
            if not values.get("allow_remote") and not is_loopback(http_host):
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
    def remote(self) -> bool:
        """The repository is an object store (Triton reads it over the network; nothing local to create)."""
        return isinstance(self.repository, str)

    def prepare_repository(self) -> None:
        """A local repository directory exists before the server starts (created empty when absent)."""
        if isinstance(self.repository, str):
            return
        if self.repository.exists() and not self.repository.is_dir():
            raise InputError(f"Triton model repository {self.repository} is a file, not a directory")
        if not self.repository.exists():
            self.repository.mkdir(parents=True)
            log.info("created empty model repository %s", self.repository)

    def process_environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` (the server's prepared environment) with :attr:`environment` added."""
        return {**base, **self.environment}

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
        return hostport(self.client_host, self.http_port)

    @property
    def grpc_url(self) -> str:
        return hostport(self.client_host, self.grpc_port)

    @property
    def metrics_url(self) -> str:
        return hostport(self.client_host, self.metrics_port)

    def command(self, server_dir: Path, shm_prefix: str, control_key: str | None = None) -> list[str]:
        """The ``tritonserver`` command line for this config, run from a prepared ``server_dir``.

        ``control_key`` (default: :attr:`control_key`) is on it in clear: log it through
        :func:`seqcls.localtriton.keys.masked` only.
        """
        key = control_key or self.control_key
        if not key:
            raise InputError("no Triton control key: pass control_key (LocalTriton.start reads the key file)")
        return [
            str(server_dir / "bin" / "tritonserver"),
            f"--model-repository={self.repository}",
            "--model-control-mode=explicit",
            f"--backend-directory={server_dir / 'backends'}",
            f"--cache-directory={server_dir / 'caches'}",
            # See the module docstring: one failed load must not poison server readiness.
            "--strict-readiness=false",
            "--disable-auto-complete-config",  # configs are rendered complete: no extra stub per load
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false",  # no DCGM probing on CPU hosts; CPU metrics stay on
            f"--exit-timeout-secs={self.exit_timeout}",
            f"--log-verbose={self.log_verbose}",
            f"--backend-config=python,shm-default-byte-size={self.shm_default_byte_size}",
            f"--backend-config=python,shm-growth-byte-size={self.shm_growth_byte_size}",
            # Our own prefix lets stop() remove regions a SIGKILLed server leaves in /dev/shm.
            f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
            *restricted_flags(key),
            *self.extra_args,
        ]

    def options(self) -> dict[str, Any]:
        """The options a running server was started with (recorded in its state file)."""
        return {
            "log_verbose": self.log_verbose,
            "extra_args": list(self.extra_args),
            "shm_default_byte_size": self.shm_default_byte_size,
            "shm_growth_byte_size": self.shm_growth_byte_size,
            "exit_timeout": self.exit_timeout,
        }
