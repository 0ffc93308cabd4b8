"""TCP ports: free ones for tests and benchmarks, and a clear error when Triton's are taken."""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

from seqcls.errors import InputError, SeqclsError, ServingError
from seqcls.localtriton.config import TritonServerConfig

log = logging.getLogger(__name__)

#: How long a port held by something that is not a listener is waited for before starting fails.
PORT_WAIT = 5.0

#: ``low-high`` (inclusive): where :func:`free_ports` picks. Concurrent pickers that each keep to a slice of
#: their own (the test suite's pytest-xdist workers) cannot hand one port to two servers; a process started
#: with it set passes it on to its children.
PORT_RANGE_VAR = "SEQCLS_PORT_RANGE"

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 1024
_PICKS = 200
#: Ports this process handed out lately: picked last, as their server may not have bound them yet.
_RECENT = 1024
_handed: dict[int, None] = {}
_handed_lock = threading.Lock()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for bind(0) and connect(): Linux's own, else the IANA range."""
    try:
        low, high = (int(x) for x in _EPHEMERAL_RANGE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def default_port_range() -> tuple[int, int]:
    """Where ports are picked unless :data:`PORT_RANGE_VAR` says: below the kernel's ephemeral range when
    there is room (2000 ports or more), else every unprivileged port."""
    low, _ = ephemeral_range()
    return (_LOWEST, low - 1) if low - _LOWEST >= 2000 else (_LOWEST, 65535)


def port_range(environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """:data:`PORT_RANGE_VAR` of ``environ`` (default ``os.environ``) as (low, high), inclusive; None when unset."""
    value = (os.environ if environ is None else environ).get(PORT_RANGE_VAR, "")
    if not value.strip():
        return None
    low, sep, high = value.strip().partition("-")
    try:
        bounds = (int(low), int(high)) if sep else None
    except ValueError:
        bounds = None
    if bounds is None or not 1 <= bounds[0] <= bounds[1] <= 65535:
        raise InputError(
            f"{PORT_RANGE_VAR}={value!r} is not a port range: expected low-high, two ports in 1..65535 with "
            "low <= high (e.g. 20000-29999); fix or unset it"
        )
    return bounds


def port_slice(index: int, count: int, low: int, high: int) -> tuple[int, int]:
    """Slice ``index`` of ``count`` disjoint, near-equal slices covering ``low..high`` (inclusive), e.g. one per
    concurrent worker."""
    size = high - low + 1
    if not 0 <= index < count or count > size:
        raise ValueError(f"no slice {index} of {count} (0 to {count - 1}) in ports {low}-{high}")
    return low + size * index // count, low + size * (index + 1) // count - 1


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

    Picked in :data:`PORT_RANGE_VAR` when it is set. Otherwise below the kernel's ephemeral range when there
    is room: ports in it are what any process's bind(0) or outgoing connection takes, so a server restarted
    on its port after a crash could find it taken by a stranger's socket. Ports this process handed out
    lately are picked last: their server may not have bound them yet.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    configured = port_range()
    low, high = configured or default_port_range()
    if configured is None and high == 65535:
        candidates: list[int] = []  # no room below the ephemeral range: the kernel's choice (bind(0))
    else:
        candidates = random.sample(range(low, high + 1), min(_PICKS, high - low + 1))
    with _handed_lock:
        candidates.sort(key=lambda port: port in _handed)  # stable: still random among the rest
    socks: list[socket.socket] = []
    try:
        for port in candidates:
            if len(socks) == n:
                break
            s = _bindable(family, host, port)
            if s is not None:
                socks.append(s)
        if configured is not None and len(socks) < n:
            raise InputError(
                f"{PORT_RANGE_VAR}={low}-{high} has {len(socks)} free port(s) on {host} among {len(candidates)} "
                f"tried; {n} were asked for: widen the range or stop what holds its ports"
            )
        while len(socks) < n:
            s = socket.socket(family, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        ports = tuple(s.getsockname()[1] for s in socks)
    finally:
        for s in socks:
            s.close()
    with _handed_lock:
        for port in ports:
            _handed.pop(port, None)
            _handed[port] = None
        while len(_handed) > _RECENT:
            del _handed[next(iter(_handed))]
    return ports


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now (for tests; another process may still take it before you bind)."""
    return free_ports(1, host)[0]


def process_label(pid: int | None) -> str:
    """'pid N (name)' for messages naming who holds a port; None is a process psutil cannot see (another user's)."""
    if pid is None:
        return "a process of another user"
    try:
        return f"pid {pid} ({psutil.Process(pid).name()})"
    except psutil.Error:
        return f"pid {pid}"


def port_listeners(port: int) -> list[int | None]:
    """The pid of each listener on local ``port`` (any address; None: one psutil cannot attribute, another
    user's); empty when none is seen or the system does not tell."""
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return []
    return [c.pid for c in conns if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN]


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
            listener = f" by {process_label(conn.pid)}" if conn.pid else " by a listener of another user"
        else:
            owner = process_label(conn.pid) if conn.pid else "no process"
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


def check_port_free(
    host: str, port: int, service: str, *, wait: float = PORT_WAIT, error: type[SeqclsError] = ServingError
) -> None:
    """Fail before starting ``service`` when ``port`` on ``host`` is taken, naming who holds it (as ``error``).

    A listener fails at once. Anything else holding the port — a socket bound but not listening, a
    connection using it as its local port — is usually gone in moments (another process probing for
    a free port, a server between bind and listen), so it is waited for up to ``wait`` seconds.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    deadline = time.monotonic() + wait
    logged = False
    while (exc := _taken(family, host, port)) is not None:
        listener, others = port_holders(port)
        where = f"port {port} ({service}) on {host} is already in use"
        if listener:
            raise error(
                f"{where}{listener}: stop that process or choose another {service} port ({exc.strerror})."
            ) from exc
        if time.monotonic() >= deadline:
            holders = "; ".join(others) or "a socket bound but not listening (no process shows it)"
            raise error(
                f"{where}, held by {holders} (waited {wait:g} s): stop that process or choose "
                f"another {service} port ({exc.strerror})."
            ) from exc
        if not logged:
            log.info("port %s (%s) is held by no listener; waiting up to %g s", port, service, wait)
            logged = True
        time.sleep(0.1)


def check_ports_free(config: TritonServerConfig, wait: float = PORT_WAIT) -> None:
    """Fail before starting Triton when its HTTP, gRPC or metrics port is taken (:func:`check_port_free`)."""
    services = (("HTTP", config.http_port), ("gRPC", config.grpc_port), ("metrics", config.metrics_port))
    for service, port in services:
        check_port_free(config.host, port, f"Triton {service}", wait=wait)
