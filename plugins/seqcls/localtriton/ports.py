"""TCP ports: free ones for tests and benchmarks, and a clear error when Triton's are taken."""

from __future__ import annotations

import socket

import psutil

from seqcls.errors import ServingError
from seqcls.localtriton.config import TritonServerConfig


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


def port_owner(port: int) -> str:
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


def check_ports_free(config: TritonServerConfig) -> None:
    """Fail before starting when the HTTP, gRPC or metrics port is taken, naming who holds it."""
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
                    f"{port_owner(port)}: stop that process or choose another {service} port"
                    f" ({exc.strerror})."
                ) from exc
