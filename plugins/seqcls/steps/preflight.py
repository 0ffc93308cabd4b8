"""Preflight: what a release checks at resolve, in seconds, before any heavy step.

A release that will fail on a typo'd param or a stopped server should say so before export, convert
and validate have spent half a minute (minutes for a base-size model): :func:`preflight` checks the
params against the checkpoint (per-label thresholds name its labels), the eval set (read once and kept,
:func:`~seqcls.release.kept.preflight_eval_set`), and — when the release will get that far — every
Triton endpoint with the control key and the MLflow registry. A bad param is an
:class:`~seqcls.errors.InputError`; unreachable servers one :class:`PreflightError` naming each
address and the setting or Connection to fix (retryable: a restarting server may answer next time).

The server checks are also what a Connection's *Test* button runs (:mod:`seqcls.airflow.hooks`):

- Triton, per replica: gRPC liveness, then the repository index *with the control key* — the
  restricted call every release starts with, so a wrong key fails here as it would fail a release —
  and the HTTP endpoint's ``/v2/health/live`` when one is configured. No retries: an answer in seconds.
- MLflow: one registry call (``search_registered_models(max_results=1)``) with the Connection's
  credentials in MLflow's variables, MLflow's HTTP retries off for the call.

Messages name the address and what to fix; they never carry a key, password or token.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from seqcls.contract import runtime
from seqcls.errors import InputError, SeqclsError
from seqcls.frameworks.output import library_output
from seqcls.gates.evalset import EvalSet
from seqcls.registry.ledger import client, tracking_uri
from seqcls.release.kept import preflight_eval_set
from seqcls.release.keys import release_key
from seqcls.release.workspace import Release
from seqcls.serving.client import ControlRefused, Endpoint, TritonOps, endpoints_from_settings
from seqcls.serving.repository import ServingOptions
from seqcls.settings import ENV_MLFLOW_URI, ENV_TRITON_GRPC, Settings, scoped_environ
from seqcls.spec import AUTO_PROFILE, ENGINES, NEEDS_PROVIDER, SERVED_PROFILES, host_refusal
from seqcls.steps import ORDER

log = logging.getLogger(__name__)

TIMEOUT_S = 5.0
#: MLflow's own HTTP settings for the test call: one attempt (its default retries take minutes).
MLFLOW_FAIL_FAST = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
MAX_DETAIL = 300
#: MLflow's error codes for a refused login/token (HTTP 401 / 403).
REFUSED = frozenset({"UNAUTHENTICATED", "PERMISSION_DENIED"})


def _detail(exc: BaseException) -> str:
    """The error's own text (tritonclient's ``message()``), on one line, cut to :data:`MAX_DETAIL`."""
    message = getattr(exc, "message", None)
    text = " ".join(str(message() if callable(message) else exc).split())
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"


def _http_live(address: str, timeout: float) -> str | None:
    """None when ``address`` answers ``/v2/health/live`` with 200, else why not."""
    base = address if address.startswith(("http://", "https://")) else f"http://{address}"
    try:
        with urllib.request.urlopen(f"{base.rstrip('/')}/v2/health/live", timeout=timeout) as r:
            return None if r.status == 200 else f"HTTP {address} answered {r.status} to /v2/health/live"
    except (urllib.error.URLError, OSError) as exc:
        return f"HTTP {address} is not answering ({_detail(exc)})"


def triton_replica(endpoint: Endpoint, timeout: float = TIMEOUT_S) -> tuple[bool, str]:
    """One replica: live over gRPC, the repository index with the key, HTTP live (if configured)."""
    from tritonclient.utils import InferenceServerException

    ops = TritonOps(endpoint, request_timeout=timeout)
    try:
        if not ops.client.is_server_live(client_timeout=timeout):
            return False, f"Triton at {endpoint.grpc} is not live"
    except InferenceServerException as exc:
        return False, f"Triton is not answering at {endpoint.grpc} (gRPC): {_detail(exc)}"
    try:
        index = ops.repository_index(timeout)
    except ControlRefused as exc:
        return False, str(exc)
    except InferenceServerException as exc:
        return False, f"Triton at {endpoint.grpc}: the repository index failed: {_detail(exc)}"
    line = f"{endpoint.grpc} live, model control accepted the key ({len(index)} model version(s) indexed)"
    if endpoint.http:
        problem = _http_live(endpoint.http, timeout)
        if problem:
            return False, f"Triton at {endpoint.grpc}: {problem}"
        line += f", HTTP {endpoint.http} live"
    return True, line


def check_triton(
    endpoints: Sequence[Endpoint], repository: Path | str | None, key_source: str, timeout: float = TIMEOUT_S
) -> tuple[bool, str]:
    """Every replica (the first failure is the message); the repository is only reported: the API
    server that runs the test need not mount it, the workers must."""
    lines = []
    for endpoint in endpoints:
        ok, line = triton_replica(endpoint, timeout)
        if not ok:
            return False, line
        lines.append(line)
    where = ""
    if str(repository or "").startswith("s3://"):
        where = f"; repository {repository}: an object store (the workers reach it with its store Connection)"
    elif repository is not None:
        seen = "exists here" if Path(repository).is_dir() else "not visible here (the workers must mount it)"
        where = f"; repository {repository}: {seen}"
    return True, f"Triton OK — {len(lines)} replica(s): {'; '.join(lines)}; control key from {key_source}{where}"


def check_mlflow(settings: Settings, credentials: Mapping[str, str | None]) -> tuple[bool, str]:
    """One registry call against the settings' tracking URI with ``credentials`` (MLflow's variables)."""
    uri = tracking_uri(settings)
    with scoped_environ({**MLFLOW_FAIL_FAST, **credentials}):
        try:
            found = client(settings).search_registered_models(max_results=1)
        except Exception as exc:
            detail = _detail(exc)
            code = str(getattr(exc, "error_code", ""))  # an MlflowException from MLflow's JSON error body
            if code in REFUSED or any(f"error code {status}" in detail for status in ("401", "403")):
                return False, (
                    f"MLflow at {uri} refused the credentials ({detail[:120]}): set the Connection's login and "
                    "password, or a token (the CLI: MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or "
                    "MLFLOW_TRACKING_TOKEN)"
                )
            return False, f"MLflow at {uri} did not answer the registry call: {detail}"
    what = "registered models found" if found else "no registered model yet"
    auth = "with the Connection's credentials" if credentials else "without credentials"
    return True, f"MLflow OK — the model registry at {uri} answered {auth} ({what})"


class PreflightError(SeqclsError):
    """Triton or MLflow did not answer the preflight; the message names each address and what to fix."""


#: Where the CLI's servers come from, named in a failed preflight (the DAG names its Connections).
CLI_SOURCES = {
    "triton": f"{ENV_TRITON_GRPC} or --grpc (for the local server: `seqcls triton start`)",
    "mlflow": ENV_MLFLOW_URI,
}


@dataclass(frozen=True)
class Check:
    """One preflight check: what, whether it passed, what it saw, how long it took."""

    name: str
    ok: bool
    detail: str
    seconds: float


@dataclass
class Preflight:
    """Every check that ran, and the eval set read (kept in the workspace) for the quality gate."""

    checks: list[Check] = field(default_factory=list)
    eval_set: EvalSet | None = None

    def line(self) -> str:
        took = sum(c.seconds for c in self.checks)
        said = ", ".join(f"{c.name} {'ok' if c.ok else 'FAILED'}" for c in self.checks)
        unchecked = [name for name in SERVERS if name not in {c.name for c in self.checks}]
        tail = f" ({' and '.join(unchecked)} not checked: the release stops before needing them)" if unchecked else ""
        return f"preflight: {said} in {took:.1f}s{tail}"


#: The servers a release needs, and the first step that needs each.
SERVERS = {"mlflow": "register", "triton": "reload"}


def servers_for(until: str | None) -> tuple[str, ...]:
    """The servers a release run up to ``until`` (None: to the end) talks to."""
    last = ORDER.index(until) if until is not None else len(ORDER)
    return tuple(name for name, first in SERVERS.items() if ORDER.index(first) <= last)


def _timed(name: str, fn: Callable[[], tuple[bool, str]]) -> Check:
    t0 = time.perf_counter()
    ok, detail = fn()
    return Check(name, ok, detail, time.perf_counter() - t0)


def _params(release: Release) -> tuple[bool, str]:
    key = release_key(release)  # resolves threshold + per-label thresholds against the labels (InputError)
    cfg = release.config
    profile = cfg.profile
    if profile == AUTO_PROFILE:  # chosen at convert; nothing is measured yet
        profile = f"auto (convert serves the fastest of {', '.join(SERVED_PROFILES)} that passes)"
    options = ServingOptions.from_spec(release.serving)  # settings that cannot go together (InputError)
    if cfg.profile in NEEDS_PROVIDER or cfg.profile in ENGINES:  # fp16 on a CPU host, bf16 without bf16 CPU
        providers = runtime.choose_providers(cfg.provider, cfg.require_gpu)
        refusal = host_refusal(cfg.profile, providers=providers, device=options.device, runtime=options.runtime)
        if refusal:
            raise InputError(refusal)
    return True, f"profile {profile}, {len(cfg.thresholds)} per-label threshold(s), release key {key[:8]}"


def preflight(
    release: Release,
    *,
    servers: Sequence[str] = tuple(SERVERS),
    sources: Mapping[str, str] | None = None,
    timeout: float = TIMEOUT_S,
) -> Preflight:
    """Check the release's params, eval set and ``servers`` (of :data:`SERVERS`); raise on the first bad
    input, or once for every server that did not answer. ``sources`` names where each server's address
    comes from (default: the CLI's settings)."""
    report = Preflight()
    report.checks.append(_timed("params", lambda: _params(release)))
    t0 = time.perf_counter()
    report.eval_set = preflight_eval_set(release)
    es = report.eval_set
    seen = f"{len(es.texts)} labeled texts ({es.source})" if es is not None else "none (the quality gate says so)"
    report.checks.append(Check("eval set", True, seen, time.perf_counter() - t0))
    where = {**CLI_SOURCES, **(sources or {})}
    settings = release.settings
    probes = {
        "triton": lambda: check_triton(endpoints_from_settings(settings), None, "settings", timeout),
        "mlflow": lambda: check_mlflow(settings, {}),  # the caller's credentials are in MLflow's variables
    }
    with library_output("preflight"):  # MLflow's first-use banners
        ran = [_timed(name, probes[name]) for name in SERVERS if name in servers]
    report.checks += ran
    problems = [f"{c.detail} — check {where[c.name]}" for c in ran if not c.ok]
    if problems:
        raise PreflightError(
            f"preflight of {release.config.model_name}: "
            + "; ".join(problems)
            + ". Nothing was exported, registered or published."
        )
    log.info("%s", report.line())
    return report


__all__ = [
    "SERVERS",
    "Preflight",
    "PreflightError",
    "check_mlflow",
    "check_triton",
    "preflight",
    "servers_for",
    "triton_replica",
]
