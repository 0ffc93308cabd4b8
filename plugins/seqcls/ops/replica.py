"""``seqcls replica-ready``: does this one Triton replica serve what the fleet serves?

A replica in explicit mode starts with whatever its ``config.pbtxt`` files say and, with
``--strict-readiness=false``, reports ready whether or not that is the recorded serving state. This
check is what a Kubernetes probe runs against its own pod's Triton before the pod takes traffic: for
every model with a recorded state, the served version of each Triton model that must hold it (the
public ensemble; the composing models unless the version is direct) is READY on this replica, and
the public route answers one tiny request pinned to that version. ``reconcile=True`` first makes this
one replica serve the recorded state, exactly as ``seqcls sync`` does per replica
(:func:`seqcls.release.control.reconcile_recorded`: the state is read, never written).

Only the served version gates readiness: a missing candidate or warm previous version does not turn
traffic away (the release or ``seqcls sync`` loads them). One model's damage (an unreadable state, a
version that does not load) is reported for that model and every other model is still checked. The
whole check is bounded by ``timeout``: a probe must answer, even while a release holds the lock.
"""

from __future__ import annotations

import argparse
import logging
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from seqcls.contract.names import ModelName
from seqcls.errors import InputError, SeqclsError
from seqcls.ops.sync import models_in, operator_models
from seqcls.release import control
from seqcls.serving.client import DNS_PREFIX, Endpoint, TritonOps
from seqcls.serving.reconcile import desired_versions
from seqcls.serving.repository import Repository, ServingOptions
from seqcls.serving.state import current_state
from seqcls.settings import ENV_TRITON_GRPC, Settings

log = logging.getLogger(__name__)

#: Seconds the whole check may take: below a probe's ``timeoutSeconds``.
DEFAULT_TIMEOUT = 20.0
HELP = (
    "exit 0 only if ONE Triton replica serves every model's recorded version (READY, answers a request); "
    "--reconcile loads it there first; for readiness/startup probes"
)
#: The one text the public route must answer (any text will do: it proves the pipeline runs).
PROBE_TEXT = "replica-ready"


def one_line(text: str, width: int = 300) -> str:
    """Triton's errors carry Python tracebacks; a probe's answer is one line per model."""
    return textwrap.shorten(" ".join(str(text).split()), width, placeholder=" …")


class ReplicaOps(Protocol):
    """What the check asks of one replica (:class:`~seqcls.serving.client.TritonOps`; fakes in tests)."""

    def live(self) -> bool: ...

    def ready(self, model: str, version: int | None = None) -> bool: ...

    def infer(self, texts: Sequence[str], *, model: str, version: int | None = None) -> Any: ...

    def index_states(self, model: str | None = None) -> dict[str, Any]: ...


#: ``(repo, model_name, endpoint) -> errors``: reconcile one replica to the recorded state.
Reconciler = Callable[[Repository, ModelName, Endpoint], dict[str, str]]


@dataclass
class ModelReadiness:
    """One model on one replica: ``ready`` only when its served version is loaded and answers."""

    model_name: str
    serving: int | None
    ready: bool
    missing: list[str] = field(default_factory=list)
    fix: str = ""
    actions: list[str] = field(default_factory=list)

    def line(self) -> str:
        if self.ready:
            what = f"serves recorded v{self.serving}" if self.serving is not None else "nothing recorded as served"
            return f"{self.model_name}: ready ({what})"
        return f"{self.model_name}: NOT ready — {'; '.join(self.missing)}. {self.fix}"


@dataclass
class ReplicaReadiness:
    """The answer for one replica; ``ready`` = live, not timed out, and every model ready."""

    url: str
    live: bool
    models: list[ModelReadiness] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    @property
    def ready(self) -> bool:
        return self.live and self.error is None and all(m.ready for m in self.models)

    def lines(self) -> list[str]:
        head = f"replica {self.url}: {'ready' if self.ready else 'NOT ready'} ({self.seconds:.2f}s)"
        return [head, *([f"  {self.error}"] if self.error else []), *(f"  {m.line()}" for m in self.models)]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ready": self.ready}


def replica_url(url: str | None, settings: Settings) -> str:
    """The replica to check: ``url``, else the one endpoint ``SEQCLS_TRITON_GRPC`` names (default: the local
    Triton, 127.0.0.1:8001). A list or a ``dns:///`` name is a fleet, not one replica: refused, naming it."""
    if url:
        return url
    grpcs = list(settings.triton_grpc)
    if len(grpcs) == 1 and not grpcs[0].startswith(DNS_PREFIX):
        return grpcs[0]
    raise InputError(
        f"{ENV_TRITON_GRPC}={','.join(grpcs)} names more than one replica; replica-ready checks one: give "
        "--url HOST:PORT (in a Triton pod: localhost:8001)"
    )


def required_versions(repo: Repository, model_name: ModelName) -> tuple[int | None, dict[str, int]]:
    """(served version, Triton model → that version) of what must be READY for traffic; reads the state only."""
    state = current_state(repo.root, model_name)
    if state.serving is None:
        return None, {}
    direct = repo.direct_versions((state.serving,))
    want = desired_versions(state, keep_previous=False, direct=direct)
    return state.serving, {m: state.serving for m, versions in want.items() if state.serving in versions}


def judge(
    model_name: str, serving: int | None, required: dict[str, int], op: ReplicaOps, url: str = "<this replica>"
) -> ModelReadiness:
    """The decision for one model: every required (model, version) READY, then one request answered."""
    if serving is None:
        return ModelReadiness(model_name, None, True)
    missing = []
    for triton_model, version in required.items():
        if not op.ready(triton_model, version):
            said = op.index_states(triton_model)
            said.pop("error", None)  # no control key: Triton's reason is not readable, the gap still is
            state = f" (Triton: {', '.join(f'{k} {v}' for k, v in said.items())})" if said else ""
            missing.append(one_line(f"{triton_model} v{version} not READY{state}"))
    names = ModelName(model_name).names
    if not missing:
        try:
            op.infer([PROBE_TEXT], model=names.ensemble, version=serving)
        except Exception as exc:  # any failure to answer is the gap this check exists to find
            missing.append(one_line(f"{names.ensemble} v{serving} did not answer a request: {exc}"))
    fix = (
        f"Run `seqcls replica-ready --reconcile --url {url} --model-name {model_name}` (or `seqcls sync`); "
        f"if it fails to load, `seqcls status --model-name {model_name}` names the damaged file and its fix"
    )
    return ModelReadiness(model_name, serving, not missing, missing, fix if missing else "")


def _reconcile_one(repo: Repository, model_name: ModelName, endpoint: Endpoint) -> dict[str, str]:
    """``seqcls sync``'s reconcile of the recorded state, on this one replica only (state never written)."""
    _, report = control.reconcile_recorded(
        repo, model_name, [endpoint], keep_previous=ServingOptions.keep_previous_loaded
    )
    return report.errors


def check_model(
    settings: Settings,
    model_name: ModelName,
    op: ReplicaOps,
    endpoint: Endpoint,
    reconcile: Reconciler | None,
) -> ModelReadiness:
    """One model on one replica; its own failure (an unreadable state, a load error) is its result."""
    repo = Repository.from_settings(settings, model_name)
    actions: list[str] = []
    try:
        if reconcile is not None:
            errors = reconcile(repo, model_name, endpoint)
            actions += [one_line(f"reconcile: {e}") for e in errors.values()]
        serving, required = required_versions(repo, model_name)
        result = judge(model_name, serving, required, op, endpoint.grpc)
    except Exception as exc:
        log.warning("replica-ready %s: %s", model_name, exc, exc_info=not isinstance(exc, SeqclsError))
        fix = f"`seqcls status --model-name {model_name}` says what is damaged and how to repair it"
        return ModelReadiness(model_name, None, False, [one_line(f"{type(exc).__name__}: {exc}", 500)], fix, actions)
    if not result.ready:
        result.missing += actions  # what reconcile could not do says why
    return result


def replica_ready(
    settings: Settings,
    url: str,
    *,
    model_names: Sequence[str] | None = None,
    reconcile: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    ops: ReplicaOps | None = None,
    reconciler: Reconciler | None = None,
) -> ReplicaReadiness:
    """Check (optionally reconcile first) one replica at ``url`` for every (or the named) model, within
    ``timeout`` seconds; ``ops``/``reconciler`` replace the real Triton client and reconcile in tests."""
    t0 = time.perf_counter()
    endpoint = Endpoint(url, control_key=settings.control_key())
    op: ReplicaOps = ops or TritonOps(endpoint, timeout=timeout, request_timeout=min(timeout, 10.0))
    # the thread's own; the answer is built from a copy (after a timeout the thread may still run)
    models: list[ModelReadiness] = []
    found: dict[str, Any] = {"live": False, "error": None}
    done = threading.Event()

    def run() -> None:
        try:
            if not op.live():
                found["error"] = f"Triton at {url} is not live (starting, or not running): wait, or check its log"
                return
            found["live"] = True
            names = operator_models(model_names) or models_in(Path(str(settings.triton_repository)))
            fix = (reconciler or _reconcile_one) if reconcile else None
            for name in names:
                models.append(check_model(settings, name, op, endpoint, fix))
        except Exception as exc:  # the model list itself: unreadable repository
            found["error"] = one_line(f"{type(exc).__name__}: {exc}", 500)
        finally:
            done.set()

    # a daemon thread: a check stuck behind a release's lock must not keep the probe from answering
    threading.Thread(target=run, name="replica-ready", daemon=True).start()
    finished = done.wait(timeout)
    result = ReplicaReadiness(url, bool(found["live"]), list(models), found["error"])
    if not finished:
        checked = ", ".join(m.model_name for m in result.models) or "none"
        result.error = (
            f"not answered within {timeout:g}s (models checked so far: {checked}); a release or sync may hold "
            "the repository lock, or Triton is slow to load — the next probe tries again"
        )
    result.seconds = time.perf_counter() - t0
    log.info("replica-ready %s: %s in %.2fs", url, "ready" if result.ready else "NOT ready", result.seconds)
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``seqcls replica-ready``'s options (the CLI registers the command; the probe's contract lives here)."""
    p.add_argument(
        "--url", default=None, metavar="HOST:PORT", help="the replica's gRPC address (default: "
        "$SEQCLS_TRITON_GRPC when it names one, else 127.0.0.1:8001)"
    )  # fmt: skip
    p.add_argument("--reconcile", action="store_true", help="first load the recorded versions on this replica")
    p.add_argument("--model-name", type=ModelName, default=None, help="one model (default: every recorded model)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds for the whole check (default 20)")
    p.add_argument("--home", type=Path, default=None, help="release home (default: $SEQCLS_HOME or ~/.seqcls)")
    p.add_argument("--json", action="store_true", help="print JSON")
