"""The one Triton client (tritonclient over gRPC): model control *and* inference.

Every call seqcls makes to a Triton server goes through :class:`TritonOps`, with a timeout and
the single retry policy :func:`retrying`. Explicit model control has traps this module exists to
absorb: a ``load`` that returns OK is no proof the model (or the ensemble built on it) is ready,
``unload`` is asynchronous, and the interesting error text is the server's own. So every load is
followed by per-model, per-version readiness checks, transport errors (UNAVAILABLE, connection
refused, deadline) are retried with backoff — and nothing else is, because a config or
``initialize()`` error, or a bad request, will not fix itself.

Model control (load, unload, repository index) carries the endpoint's control key (the header
:data:`~seqcls.settings.CONTROL_HEADER`; ``Settings.control_key()``); inference, health and metadata
never do. A refusal — no key, or the wrong one — is :class:`ControlRefused`, never retried (Triton's
gRPC answers it UNAVAILABLE), naming the setting to fix.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from seqcls.contract import shipped
from seqcls.contract.names import ENSEMBLE
from seqcls.errors import InputError, ServingError
from seqcls.settings import (
    CONTROL_KEY_FILE,
    ENV_TRITON_CONTROL_KEY,
    ENV_TRITON_RESOLVE,
    Settings,
    control_headers,
    triton_resolve,
)

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRYABLE = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED", "StatusCode.RESOURCE_EXHAUSTED")
#: Triton's repository index lists the repository, then stats each entry: an entry renamed or removed in
#: between (any model's temp file or staged version in the shared root) fails the whole index with this,
#: and reading it again succeeds. Read up to this many times, 10 ms apart doubling to 250 ms (under 1 s in all).
LISTING_RACE = "failed to stat file"
LISTING_ATTEMPTS = 8


@dataclass(frozen=True)
class Endpoint:
    """One Triton replica: its gRPC address (``host:port``), optional HTTP address, and the key its
    model control requires (never in ``repr``, not part of equality)."""

    grpc: str
    http: str | None = None
    metrics: str | None = None  # host:port of Triton's Prometheus metrics (None: not configured)
    control_key: str | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        host, _, port = self.grpc.rpartition(":")
        if not host or not port.isdigit():
            raise InputError(f"Triton gRPC endpoint {self.grpc!r} is not host:port")


DNS_PREFIX = "dns:///"


def _split(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InputError(f"Triton endpoint {target!r} is not host:port (or dns:///name:port)")
    return host.strip("[]"), int(port)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def resolve_replicas(name: str) -> list[str]:
    """Every address ``name`` resolves to (sorted, deduplicated): each is one Triton replica."""
    import socket

    pinned = triton_resolve().get(name)
    if pinned:
        return sorted(set(pinned))
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ServingError(
            f"Triton endpoint dns:///{name}: the name does not resolve ({exc}); check the Service name in "
            f"SEQCLS_TRITON_GRPC / the Triton Connection, or pin it with {ENV_TRITON_RESOLVE}"
        ) from exc
    return sorted({str(info[4][0]) for info in infos})


def _expand(target: str) -> list[tuple[str, str | None]]:
    """``dns:///name:port`` → (address:port, name) per resolved address; ``host:port`` → itself."""
    if not target.startswith(DNS_PREFIX):
        return [(target, None)]
    name, port = _split(target[len(DNS_PREFIX) :])
    return [(_join(addr, port), name) for addr in resolve_replicas(name)]


def _same_host(host: str, target: str | None) -> str | None:
    """A replica's HTTP or metrics address: the resolved ``host`` at the port ``target`` names."""
    if target is None:
        return None
    return f"{host}:{_split(target[len(DNS_PREFIX) :] if target.startswith(DNS_PREFIX) else target)[1]}"


def endpoints_from_settings(settings: Settings, grpc: Sequence[str] | None = None) -> list[Endpoint]:
    """One :class:`Endpoint` per Triton replica.

    A ``dns:///name:port`` entry (gRPC's own target syntax) stands for every address ``name``
    resolves to — a Kubernetes headless Service — resolved now, so a release reloads, checks and
    smoke-tests each replica. Its HTTP entry at the same position (``dns:///name:8000``) gives each
    replica's HTTP port. Plain ``host:port`` entries are one replica each, in order.
    """
    grpcs = list(grpc) if grpc else list(settings.triton_grpc)
    https = list(settings.triton_http) if not grpc else []
    metrics = list(settings.triton_metrics) if not grpc else []
    key = settings.control_key()
    out: list[Endpoint] = []
    for i, target in enumerate(grpcs):
        http = https[i] if i < len(https) else None
        metric = metrics[i] if i < len(metrics) else None
        for address, name in _expand(target):
            if name is None:
                out.append(Endpoint(address, http, metric, control_key=key))
                continue
            host = address.rpartition(":")[0]
            out.append(Endpoint(address, _same_host(host, http), _same_host(host, metric), control_key=key))
    if not out:
        raise ServingError(f"no Triton endpoint: {grpcs} resolved to no address")
    return out


def _status(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    return str(status() if callable(status) else status or "")


def _message(exc: Exception) -> str:
    msg = getattr(exc, "message", None)
    return str(msg() if callable(msg) else msg or exc)


class ControlRefused(ServingError):
    """Triton refused a model-control call: the control key is missing or wrong."""


def _refused(exc: Exception) -> bool:
    """Triton's answer to a restricted call without the right key (HTTP 403; gRPC UNAVAILABLE in 2.51)."""
    text = _message(exc)
    status = _status(exc)
    return ("is restricted, expecting header" in text) or status in ("403", "StatusCode.PERMISSION_DENIED")


def control_refused(endpoint: str, what: str, exc: Exception, *, sent: bool) -> ControlRefused:
    """The error naming the setting to fix (the setting first: callers may cut long messages)."""
    return ControlRefused(
        f"Triton at {endpoint} refused model control ({what}): "
        f"{'the control key sent is wrong' if sent else 'no control key is set'} — set {ENV_TRITON_CONTROL_KEY} "
        f"/ the Triton Connection's password to the server's key (a local Triton's: {CONTROL_KEY_FILE} in its "
        f"model repository). Server: {_message(exc)} ({_status(exc) or 'no status'})"
    )


class ControlClient:
    """A tritonclient gRPC client that sends the control key on model-repository calls — and only there.

    Every other attribute is the raw client's own, so inference, health and metadata requests never
    carry the key. Refusals become :class:`ControlRefused` here, before any retry policy sees them.
    """

    CALLS = frozenset({"load_model", "unload_model", "get_model_repository_index"})

    def __init__(self, raw: Any, endpoint: Endpoint) -> None:
        self._raw, self._endpoint = raw, endpoint

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._raw, name)
        return functools.partial(self._control, name, attr) if name in self.CALLS else attr

    def _control(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        from tritonclient.utils import InferenceServerException

        key = self._endpoint.control_key
        if key and kwargs.get("headers") is None:
            kwargs["headers"] = control_headers(key, "grpc")
        try:
            return fn(*args, **kwargs)
        except InferenceServerException as exc:
            if _refused(exc):
                what = name.replace("get_model_", "").replace("_", " ") + (f" {args[0]!r}" if args else "")
                raise control_refused(self._endpoint.grpc, what, exc, sent=bool(key)) from exc
            raise


def retrying(what: str, fn: Callable[[], T], *, attempts: int = 4, base_delay: float = 0.5) -> T:
    """Call ``fn``, retrying transport failures with exponential backoff; the single retry policy."""
    from tritonclient.utils import InferenceServerException

    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except InferenceServerException as exc:
            if _refused(exc):  # a raw client without the key: UNAVAILABLE, but no retry will fix it
                raise ControlRefused(
                    f"{what}: refused — set {ENV_TRITON_CONTROL_KEY} / the Triton Connection's "
                    f"password to the server's key. Server: {_message(exc)}"
                ) from exc
            status = _status(exc)
            transient = status in RETRYABLE or "failed to connect" in _message(exc).lower()
            if not transient:
                raise ServingError(f"{what}: {_message(exc)} ({status or 'no status'})") from exc
            if attempt == attempts:
                raise ServingError(
                    f"{what} failed {attempts} times. Giving up. Last error: {_message(exc)} ({status}); "
                    "is the server running and reachable?"
                ) from exc
            delay = base_delay * 2 ** (attempt - 1)
            log.warning(
                "%s: %s (%s) — retrying in %.1fs (%d/%d)", what, _message(exc), status, delay, attempt, attempts
            )
            time.sleep(delay)
    raise AssertionError("unreachable")


class TritonOps:
    """Model-control operations on one endpoint; one cached gRPC client."""

    def __init__(self, endpoint: Endpoint, *, timeout: float = 300.0, request_timeout: float = 60.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout  # model control (a load can take minutes for a large model)
        self.request_timeout = request_timeout  # metadata, index, inference

    @classmethod
    def wrap(cls, raw_client: Any, **kwargs: Any) -> TritonOps:
        """Use an existing ``tritonclient.grpc.InferenceServerClient`` (same policy, its connection)."""
        ops = cls(Endpoint("wrapped-client:0"), **kwargs)  # the address lives inside the raw client
        ops.__dict__["client"] = ControlClient(raw_client, ops.endpoint)
        return ops

    @cached_property
    def client(self) -> Any:
        """The gRPC client; model-control calls on it carry the key (:class:`ControlClient`)."""
        import tritonclient.grpc as grpcclient

        return ControlClient(grpcclient.InferenceServerClient(url=self.endpoint.grpc), self.endpoint)

    def __repr__(self) -> str:
        return f"TritonOps({self.endpoint.grpc})"

    def live(self) -> bool:
        try:
            return bool(self.client.is_server_live(client_timeout=5))
        except Exception:
            return False

    def require_live(self) -> None:
        """Triton answers here *and* accepts our control key (one repository-index call): every caller is
        about to change or read what is loaded, so a wrong key fails before anything is recorded."""
        try:
            retrying(
                f"Triton at {self.endpoint.grpc} liveness",
                lambda: self.client.is_server_live(client_timeout=5) or _raise_unavailable(),
                attempts=3,
            )
        except ServingError as exc:
            raise ServingError(
                f"Triton is not answering at {self.endpoint.grpc} ({exc}). For the local server run "
                "`seqcls triton start`; for another server check SEQCLS_TRITON_GRPC or the triton_default "
                "Airflow connection."
            ) from exc
        retrying(f"repository index on {self.endpoint.grpc}", self.repository_index, attempts=3)

    def repository_index(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """Triton's repository index (``[{"name", "version", "state", "reason"}, ...]``), read again while
        another writer's rename in the repository races Triton's listing (:data:`LISTING_RACE`): one
        model's lease renewal must not fail another model's look at what is loaded. Any other error is
        the caller's, as the client raised it."""
        from tritonclient.utils import InferenceServerException

        timeout = self.request_timeout if timeout is None else timeout
        for attempt in range(1, LISTING_ATTEMPTS + 1):
            try:
                index = self.client.get_model_repository_index(as_json=True, client_timeout=timeout)
                return list(index.get("models", []))
            except InferenceServerException as exc:
                raced = _status(exc) == "StatusCode.INTERNAL" and LISTING_RACE in _message(exc)
                if not raced or attempt == LISTING_ATTEMPTS:
                    raise
                log.debug("repository index on %s raced a rename (%s): reading it again", self.endpoint.grpc, exc)
                time.sleep(min(0.005 * 2**attempt, 0.25))
        raise AssertionError("unreachable")

    def ready(self, model: str, version: int | None = None) -> bool:
        try:
            return bool(self.client.is_model_ready(model, "" if version is None else str(version), client_timeout=10))
        except Exception:
            return False

    def load(self, model: str) -> None:
        t0 = time.perf_counter()
        retrying(
            f"load {model!r} on {self.endpoint.grpc}",
            lambda: self.client.load_model(model, client_timeout=self.timeout),
        )
        log.info("triton %s: loaded %s in %.1fs", self.endpoint.grpc, model, time.perf_counter() - t0)

    def unload(self, model: str, *, wait: float = 30.0) -> None:
        retrying(
            f"unload {model!r} on {self.endpoint.grpc}",
            lambda: self.client.unload_model(model, client_timeout=self.request_timeout),
        )
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:  # unload is asynchronous
            if not self.ready(model):
                return
            time.sleep(0.1)
        raise ServingError(f"{model!r} on {self.endpoint.grpc} still ready {wait:.0f}s after unload")

    def verify_ready(self, model: str, versions: Sequence[int], *, wait: float = 10.0) -> None:
        """Every listed version of ``model`` is READY (polled briefly: state settles after load)."""
        deadline = time.monotonic() + wait
        missing = list(versions)
        while True:
            missing = [v for v in versions if not self.ready(model, v)]
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if missing:
            states = self.index_states(model)
            raise ServingError(
                f"{model!r} version(s) {missing} not ready on {self.endpoint.grpc} after load "
                f"(server says: {states or 'no such model in the repository index'})"
            )

    def index_states(self, model: str | None = None) -> dict[str, Any]:
        """``{"name/version": "STATE (reason)"}`` from the repository index."""
        try:
            index = self.repository_index()
        except Exception as exc:
            return {"error": _message(exc)}
        out: dict[str, Any] = {}
        for m in index:
            if model is None or m.get("name") == model:
                key = f"{m.get('name')}/{m.get('version', '-')}"
                out[key] = m.get("state", "?") + (f" ({m['reason']})" if m.get("reason") else "")
        return out

    def metadata(self, model: str, version: int | None = None) -> dict[str, Any]:
        return retrying(
            f"metadata of {model!r} on {self.endpoint.grpc}",
            lambda: self.client.get_model_metadata(
                model, "" if version is None else str(version), as_json=True, client_timeout=self.request_timeout
            ),
        )

    def infer(
        self, texts: Sequence[str], *, model: str = ENSEMBLE, version: int | None = None
    ) -> tuple[list[list[dict]], np.ndarray]:
        """One request with ``texts`` → (per-text predictions, probabilities ``[N, C]``)."""
        import numpy as np
        import tritonclient.grpc as grpcclient

        contract = shipped.contract()
        data = np.array([[t.encode("utf-8")] for t in texts], dtype=object)
        inp = grpcclient.InferInput(contract.TEXT_INPUT, list(data.shape), "BYTES")
        inp.set_data_from_numpy(data)
        names = (contract.PREDICTIONS_OUTPUT, contract.PROBABILITIES_OUTPUT)
        outs = [grpcclient.InferRequestedOutput(name) for name in names]
        result = retrying(
            f"infer {model!r} on {self.endpoint.grpc}",
            lambda: self.client.infer(
                model,
                [inp],
                model_version="" if version is None else str(version),
                outputs=outs,
                client_timeout=self.request_timeout,
            ),
        )
        preds = [json.loads(row[0]) for row in result.as_numpy(names[0])]
        return preds, result.as_numpy(names[1])


def _raise_unavailable() -> None:
    from tritonclient.utils import InferenceServerException

    raise InferenceServerException("server not live", status="StatusCode.UNAVAILABLE")


def ops_for(endpoints: Sequence[Endpoint], *, timeout: float = 300.0) -> list[TritonOps]:
    if not endpoints:
        raise InputError("no Triton endpoint configured; set SEQCLS_TRITON_GRPC or the triton_default connection")
    return [TritonOps(e, timeout=timeout) for e in endpoints]
