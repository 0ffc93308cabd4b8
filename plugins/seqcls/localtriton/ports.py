"""TCP ports: free ones for tests and benchmarks, and a clear error when Triton's are taken."""

from __future__ import annotations

import logging
import random
import socket
import time
from pathlib import Path

import psutil

from seqcls.errors import ServingError
from seqcls.localtriton.config import TritonServerConfig

log = logging.getLogger(__name__)

#: How long a port held by something that is not a listener is waited for before starting fails.
PORT_WAIT = 5.0

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 1024
_PICKS = 200


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for bind(0) and connect(): Linux's own, else the IANA range."""
    try:
        low, high = (int(x) for x in _EPHEMERAL_RANGE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def _bindable(family: int, host: str, port: int) -> socket.socket | None:
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.bind((host, port))
    except OSError:
        s.close()
        return None
    return s


def free_ports(n: int, host: str = "127.0.0.1") -> tuple[int, ...]:
    """``n`` distinct ports free right now (held open together so they cannot repeat).

    Picked below the kernel's ephemeral range when there is room: ports in it are what any process's
    bind(0) or outgoing connection takes, so a server restarted on its port after a crash could find
    it taken by a stranger's socket.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks: list[socket.socket] = []
    try:
        low, _ = ephemeral_range()
        candidates = random.sample(range(_LOWEST, low), min(_PICKS, low - _LOWEST)) if low - _LOWEST >= 2000 else []
        for port in candidates:
            if len(socks) == n:
                break
            s = _bindable(family, host, port)
            if s is not None:
                socks.append(s)
        while len(socks) < n:
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


def _name(pid: int) -> str:
    try:
        return f"pid {pid} ({psutil.Process(pid).name()})"
    except psutil.Error:
        return f"pid {pid}"


def port_holders(port: int) -> tuple[str, list[str]]:
    """(listener, others) on local ``port``: 'by pid N (name)' of a listener ('' when none is seen),
    and each other socket there ('pid N (name), a connection in state S' or 'no process, ...')."""
    listener, others = "", []
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return listener, others
    for conn in conns:
        if not conn.laddr or conn.laddr.port != port:
            continue
        if conn.status == psutil.CONN_LISTEN:
            listener = f" by {_name(conn.pid)}" if conn.pid else " by a listener of another user"
        else:
            owner = _name(conn.pid) if conn.pid else "no process"
            others.append(f"{owner}, a connection in state {conn.status}")
    return listener, others


def _taken(family: int, host: str, port: int) -> OSError | None:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # Same option servers use, so a port in TIME_WAIT is not reported as busy.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc
    return None


def check_ports_free(config: TritonServerConfig, wait: float = PORT_WAIT) -> None:
    """Fail before starting when the HTTP, gRPC or metrics port is taken, naming who holds it.

    A listener fails at once. Anything else holding the port — a socket bound but not listening, a
    connection using it as its local port — is usually gone in moments (another process probing for
    a free port, a server between bind and listen), so it is waited for up to ``wait`` seconds.
    """
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    services = (("HTTP", config.http_port), ("gRPC", config.grpc_port), ("metrics", config.metrics_port))
    for service, port in services:
        deadline = time.monotonic() + wait
        logged = False
        while (exc := _taken(family, config.host, port)) is not None:
            listener, others = port_holders(port)
            where = f"port {port} (Triton {service}) on {config.host} is already in use"
            if listener:
                raise ServingError(
                    f"{where}{listener}: stop that process or choose another {service} port ({exc.strerror})."
                ) from exc
            if time.monotonic() >= deadline:
                holders = "; ".join(others) or "a socket bound but not listening (no process shows it)"
                raise ServingError(
                    f"{where}, held by {holders} (waited {wait:g} s): stop that process or choose "
                    f"another {service} port ({exc.strerror})."
                ) from exc
            if not logged:
                log.info("port %s (Triton %s) is held by no listener; waiting up to %g s", port, service, wait)
                logged = True
            time.sleep(0.1)
