"""The load drill on an ``s3://`` fleet: ≥ 10,000 requests through a release and a replica kill, none failed.

Three real ``tritonserver`` processes load from one prefix of a real SeaweedFS store (the session fixture of
:mod:`tests.helpers.seaweedfs`). Closed-loop clients (each: one request, wait for its answer, the next) send
real texts to the public model name, unpinned, the way a production client does behind a Kubernetes Service:

- **the Service** (:class:`Service`) routes to the replicas whose pod is ready: Triton's ``/v2/health/ready``
  (the Deployment's readinessProbe) answers, and the pod's startup gate (``seqcls replica-ready --reconcile``,
  the sidecar's startupProbe) has passed. It probes every :data:`PROBE_PERIOD` seconds, so a dead replica
  keeps getting requests until the next probe, as a Service's endpoints lag a dead pod;
- **the client** spreads its requests round robin over those replicas and retries a request ONCE on another
  ready replica when it fails at the connection level (gRPC UNAVAILABLE: refused, reset) — a client retry
  policy. FAILED is a request not answered after that one retry; any other error is FAILED at once.

During the load: the real ``seqcls release`` of a second checkpoint (its own process; reload, smoke, expose and
promote across the three replicas), then one replica SIGKILLed and started again as a new pod (its startup
gate reset, new connections): its readiness check says NOT ready until ``--reconcile`` made it serve the
recorded version from the store. Every answer must come from a version served at that time (the response's
model version) with labels of that version's label set — the exact labels the parity gate recorded for a golden
text. The figures go to ``var/test-artifacts/s3-load-drill.json``.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from seqcls.contract import shipped
from seqcls.contract.names import ModelName
from seqcls.localtriton import LocalTriton
from seqcls.ops.status import status
from seqcls.release.intake import open_release
from seqcls.release.records import Expected
from seqcls.settings import PROJECT_ROOT, Settings
from seqcls.steps import run_release
from tests.helpers.s3release import triton_on_store
from tests.helpers.seaweedfs import SeaweedFS, seaweedfs

__all__ = ["seaweedfs"]  # the session fixture, imported for this module's test

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.drill]

log = logging.getLogger(__name__)

MODEL = ModelName("seqcls")
ARTIFACT = PROJECT_ROOT / "var" / "test-artifacts" / "s3-load-drill.json"
CLIENTS = 8
#: Requests that must be answered in all; the load runs on after the scenario until there are as many.
TARGET = 10_000
#: Seconds between two rounds of the Service's readiness probes (a kubelet's periodSeconds, shortened).
PROBE_PERIOD = 0.5
#: Answers the restarted replica must give before the load may end: it takes its share again.
NEW_POD_ANSWERS = 300
#: Per request: a hung replica must show up as an error, not as a stuck client.
REQUEST_TIMEOUT = 10.0
#: The gRPC codes a Service + client retry policy retries once elsewhere: the connection failed, not the request.
RETRYABLE = frozenset({"StatusCode.UNAVAILABLE"})
#: Texts beyond the golden set: neither version's parity gate saw them (only the label set is checked).
EXTRA_TEXTS = ("x", "今天的天气很好", "a much longer text " * 20, "体育 财经 组织关系")


@dataclass
class LoadFleet:
    """The store's prefix, its three replicas and what a release host and a new pod are given."""

    root: Path
    uri: str
    key: str
    servers: list[LocalTriton]
    env: dict[str, str] = field(repr=False)  # the AWS variables that reach the store

    def settings(self) -> Settings:
        return Settings(
            home=self.root / "release-home",
            triton_repository=self.uri,
            triton_grpc=tuple(s.config.grpc_url for s in self.servers),
            triton_http=tuple(s.config.http_url for s in self.servers),
            triton_control_key=self.key,
        )

    def cli_env(self, home: Path, **more: str) -> dict[str, str]:
        """A ``seqcls`` process's environment: this checkout's code, the store, the control key, ``home``."""
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith(("SEQCLS_", "AWS_"))},
            **self.env,
            "PYTHONPATH": os.pathsep.join(str(PROJECT_ROOT / p) for p in ("plugins", "tools", ".")),
            "SEQCLS_HOME": str(home),
            "SEQCLS_TRITON_REPOSITORY": self.uri,
            "SEQCLS_TRITON_CONTROL_KEY": self.key,
            **more,
        }


def _aws_env(store: SeaweedFS) -> dict[str, str]:
    """The standard AWS variables that reach the store (a release host and a pod are given them)."""
    return {
        "AWS_ENDPOINT_URL_S3": store.endpoint,
        "AWS_ACCESS_KEY_ID": store.credentials.access_key_id,
        "AWS_SECRET_ACCESS_KEY": store.credentials.secret_access_key,
        "AWS_REGION": "us-east-1",
    }


@pytest.fixture(scope="module")
def load_fleet(seaweedfs: SeaweedFS, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadFleet]:
    """Three real Tritons on a fresh prefix of the store (explicit mode: each loads nothing by itself)."""
    root = tmp_path_factory.mktemp("s3load")
    uri = f"s3://{seaweedfs.bucket}/load-{uuid.uuid4().hex[:8]}"
    fleet = LoadFleet(root, uri, secrets.token_urlsafe(32), [], _aws_env(seaweedfs))
    with pytest.MonkeyPatch.context() as mp:
        for name, value in fleet.env.items():
            mp.setenv(name, value)  # this process's release reads the store through them
        try:
            for i in range(3):
                (home := root / f"replica-{i}").mkdir()
                fleet.servers.append(triton_on_store(seaweedfs, uri, home, fleet.key))
            yield fleet
        finally:
            for server in fleet.servers:
                server.stop()


# --- the Service: which replicas a client may reach ---------------------------------------------------


def _health_ready(server: LocalTriton) -> bool:
    """Triton's ``/v2/health/ready``, as the Deployment's readinessProbe asks it (httpGet, short timeout)."""
    try:
        with urllib.request.urlopen(f"http://{server.config.http_url}/v2/health/ready", timeout=1.0) as answer:
            return answer.status == 200
    except OSError:
        return False


@dataclass
class Replica:
    """One pod: its Triton, whether its startup gate passed, and its generation (a new pod: new connections)."""

    server: LocalTriton
    gated: bool = True
    generation: int = 0


class Service:
    """The ready replicas a client is given, refreshed by :meth:`probe_loop` every :data:`PROBE_PERIOD`."""

    def __init__(self, replicas: Sequence[Replica]) -> None:
        self.replicas = list(replicas)
        self.stop = threading.Event()
        self._ready: tuple[int, ...] = tuple(range(len(self.replicas)))
        self.changes: list[tuple[float, tuple[int, ...]]] = []  # (monotonic time, ready replicas)
        self.rounds = 0

    def ready(self) -> tuple[int, ...]:
        return self._ready

    def probe_loop(self) -> None:
        while not self.stop.is_set():
            now = tuple(i for i, r in enumerate(self.replicas) if r.gated and _health_ready(r.server))
            if now != self._ready:
                self.changes.append((time.monotonic(), now))
                log.info("service: ready replicas %s", now)
            self._ready = now
            self.rounds += 1
            self.stop.wait(PROBE_PERIOD)


# --- the closed-loop clients --------------------------------------------------------------------------


@dataclass
class Tally:
    """One client thread's figures (merged after the run; nothing shared while it runs)."""

    sent: int = 0
    answered: int = 0
    first_errors: Counter[str] = field(default_factory=Counter)
    retried_ok: int = 0
    failed: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    by_replica: Counter[int] = field(default_factory=Counter)
    #: (version, text index, sorted labels) → answers
    answers: Counter[tuple[int, int, tuple[str, ...]]] = field(default_factory=Counter)
    #: (replica, version) → (earliest answer's end, latest answer's start): when each version answered where
    seen: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    #: replica → the latest moment one of its answers ended
    last_answer: dict[int, float] = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)  # a few first-attempt error messages


def _ask(client: Any, text: str) -> tuple[int, tuple[str, ...]]:
    """One text to the public model name, unpinned → (the version that answered, its sorted labels)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    contract = shipped.contract()
    inp = grpcclient.InferInput(contract.TEXT_INPUT, [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text.encode("utf-8")]], dtype=object))
    out = grpcclient.InferRequestedOutput(contract.PREDICTIONS_OUTPUT)
    result = client.infer(MODEL.names.ensemble, [inp], outputs=[out], client_timeout=REQUEST_TIMEOUT)
    preds = json.loads(result.as_numpy(contract.PREDICTIONS_OUTPUT)[0][0])
    return int(result.get_response().model_version), tuple(sorted(p["label"] for p in preds))


def _code(exc: Exception) -> str:
    status_of = getattr(exc, "status", None)
    return str((status_of() if callable(status_of) else None) or type(exc).__name__)


def client_loop(service: Service, texts: Sequence[str], tally: Tally, stop: threading.Event, offset: int) -> None:
    """Send, wait, repeat: round robin over the ready replicas, one retry elsewhere on a connection error."""
    import tritonclient.grpc as grpcclient

    clients: dict[tuple[int, int], Any] = {}

    def client_for(i: int) -> Any:
        replica = service.replicas[i]
        key = (i, replica.generation)
        if key not in clients:  # a new pod has a new address: its connections are new ones
            clients[key] = grpcclient.InferenceServerClient(url=replica.server.config.grpc_url)
        return clients[key]

    turn = offset
    try:
        while not stop.is_set():
            ready = service.ready()
            if not ready:  # no endpoint at all: nothing to send to (never expected here)
                tally.first_errors["no ready replica"] += 1
                time.sleep(0.01)
                continue
            turn += 1
            first = ready[turn % len(ready)]
            index = turn % len(texts)
            tally.sent += 1
            t0 = time.monotonic()
            try:
                served_by, (version, labels) = first, _ask(client_for(first), texts[index])
            except Exception as exc:
                code = _code(exc)
                tally.first_errors[code] += 1
                if len(tally.samples) < 3:
                    tally.samples.append(f"{code} from replica {first}: {str(exc)[:200]}")
                if code not in RETRYABLE:
                    tally.failed.append(f"{code} from replica {first} (not retried): {str(exc)[:300]}")
                    continue
                others = [i for i in service.ready() if i != first]
                second = others[turn % len(others)] if others else first
                try:
                    served_by, (version, labels) = second, _ask(client_for(second), texts[index])
                except Exception as again:
                    tally.failed.append(
                        f"{code} from replica {first}, then {_code(again)} from replica {second}: {str(again)[:300]}"
                    )
                    continue
                tally.retried_ok += 1
            t1 = time.monotonic()
            tally.answered += 1
            tally.latencies.append(t1 - t0)
            tally.by_replica[served_by] += 1
            tally.answers[(version, index, labels)] += 1
            earliest_end, latest_start = tally.seen.get((served_by, version), (t1, t0))
            tally.seen[served_by, version] = (min(earliest_end, t1), max(latest_start, t0))
            tally.last_answer[served_by] = t1
    finally:
        for client in clients.values():
            client.close()


def _merged(tallies: Sequence[Tally]) -> Tally:
    out = Tally()
    for t in tallies:
        out.sent += t.sent
        out.answered += t.answered
        out.first_errors.update(t.first_errors)
        out.retried_ok += t.retried_ok
        out.failed += t.failed
        out.latencies += t.latencies
        out.by_replica.update(t.by_replica)
        out.answers.update(t.answers)
        for key, (end, start) in t.seen.items():
            e, s = out.seen.get(key, (end, start))
            out.seen[key] = (min(e, end), max(s, start))
        for i, at in t.last_answer.items():
            out.last_answer[i] = max(out.last_answer.get(i, at), at)
        out.samples += [m for m in dict.fromkeys(t.samples) if m not in out.samples][: 5 - len(out.samples)]
    return out


# --- the scenario's parts -----------------------------------------------------------------------------


def _replica_ready(fleet: LoadFleet, server: LocalTriton, home: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """``seqcls replica-ready`` as a new pod's sidecar runs it: a fresh process, its own empty home, the store."""
    argv = [sys.executable, "-m", "seqcls.cli", "replica-ready", "--url", server.config.grpc_url, "--json", *args]
    out = subprocess.run(argv, env=fleet.cli_env(home), capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return out.returncode, json.loads(out.stdout)


def _release(fleet: LoadFleet, ckpt: Path) -> tuple[subprocess.CompletedProcess, float]:
    """The real ``seqcls release`` of ``ckpt`` in its own process, to all three replicas → (its run, wall s)."""
    settings = fleet.settings()
    env = fleet.cli_env(
        settings.home,
        SEQCLS_TRITON_GRPC=",".join(settings.triton_grpc),
        SEQCLS_TRITON_HTTP=",".join(settings.triton_http),
    )
    argv = [sys.executable, "-m", "seqcls.cli", "release", "--checkpoint", str(ckpt), "--json"]
    t0 = time.monotonic()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    return out, time.monotonic() - t0


def _direct_request(server: LocalTriton, text: str) -> str:
    """One unpinned request straight to ``server``: its answer's version, or the error's code and message."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=server.config.grpc_url)
    try:
        version, _ = _ask(client, text)
        return f"answered by version {version}"
    except Exception as exc:
        return f"{_code(exc)}: {str(exc)[:200]}"
    finally:
        client.close()


def _wait(what: str, done: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        time.sleep(0.05)


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _labels_by_text(expected: Expected) -> dict[str, list[str]]:
    """Golden text → the labels the parity gate validated (texts near a threshold left out)."""
    return {item.text: sorted(item.labels) for item in expected.items if not item.near_threshold}


def test_ten_thousand_requests_through_a_release_and_a_replica_kill_none_failed(
    load_fleet: LoadFleet, tiny_checkpoint_src: Path, tiny_checkpoint_b_src: Path
) -> None:
    fleet = load_fleet
    settings = fleet.settings()
    first = open_release(shutil.copytree(tiny_checkpoint_src, fleet.root / "ckpt-a"), settings=settings)
    results = {r.step: r for r in run_release(first)}
    assert results["promote"].status == "ok", results
    expected = {1: Expected.load(first.workspace)}
    texts = [*(item.text for item in expected[1].items), *EXTRA_TEXTS]

    replicas = [Replica(s) for s in fleet.servers]
    service = Service(replicas)
    stop = threading.Event()
    tallies = [Tally() for _ in range(CLIENTS)]
    threads = [threading.Thread(target=service.probe_loop, name="service", daemon=True)]
    threads += [
        threading.Thread(target=client_loop, args=(service, texts, t, stop, i * 7), name=f"client-{i}", daemon=True)
        for i, t in enumerate(tallies)
    ]

    def answered() -> int:
        return sum(t.answered for t in tallies)

    def errors() -> int:
        return sum(t.first_errors.total() for t in tallies)

    t_start = time.monotonic()
    for thread in threads:
        thread.start()
    try:
        _wait("the first answers of version 1", lambda: answered() >= 300, 60)

        # 1. the real `seqcls release` of a second checkpoint, while the clients run
        ckpt_b = shutil.copytree(tiny_checkpoint_b_src, fleet.root / "ckpt-b")
        t_release, at_release_start, errors_before = time.monotonic(), answered(), errors()
        released, release_s = _release(fleet, ckpt_b)
        t_released = time.monotonic()
        assert released.returncode == 0, released.stderr[-3000:]
        steps = {r["step"]: r for r in json.loads(released.stdout[released.stdout.index("{") :])["results"]}
        assert steps["promote"]["status"] == "ok", steps
        expected[2] = Expected.load(open_release(ckpt_b, settings=settings).workspace)
        at_release_end, errors_at_release_end = answered(), errors()

        # 2. one replica SIGKILLed; it comes back as a new pod, gated by its readiness check
        victim_index = 1
        victim = replicas[victim_index]
        pid = victim.server.status().pid
        assert pid
        rounds = service.rounds  # killed just after a probe round: it stays an endpoint for about a period
        _wait("a probe round", lambda: service.rounds > rounds, 10)
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        victim.gated, victim.generation = False, victim.generation + 1  # the replacement pod's gate is not passed
        # a new pod has a new address: nothing reaches the old one's port once its endpoint is gone
        _wait("the killed replica out of the Service", lambda: victim_index not in service.ready(), 10)
        t_out = time.monotonic()
        victim.server.stop()  # the dead server's pid file, orphaned stubs and shm regions
        victim.server.start()
        t_live = time.monotonic()
        pod_home = fleet.root / "pod-home"
        for _ in range(10):  # HTTP answers live before gRPC listens: until the check reaches Triton, it says not live
            code, before = _replica_ready(fleet, victim.server, pod_home)
            assert code == 1 and not before["ready"], before  # never ready before it serves the recorded version
            if before["live"]:
                break
            time.sleep(0.5)
        (model,) = before["models"]
        assert model["serving"] == 2 and f"{MODEL.names.ensemble} v2 not READY" in " ".join(model["missing"]), model
        ungated = _direct_request(victim.server, texts[0])  # what a Service routing on Triton's readiness alone sends
        assert not ungated.startswith("answered"), ungated  # live, holding nothing: the gate is what keeps it out
        pod_restarts: list[str] = []  # the new pod's own crashes before its gate passed (not the clients')
        for _ in range(10):  # the startup probe, every second until it passes
            code, gate = _replica_ready(fleet, victim.server, pod_home, "--reconcile")
            if code == 0:
                break
            if not victim.server.status().running and len(pod_restarts) < 2:
                # its container died before the gate passed (seen once under a loaded CI: tritonserver aborted
                # with boost::interprocess::lock_exception while loading the python models): the kubelet's
                # restart policy starts it again; it never was in the Service, so no client saw it
                pod_restarts.append(str(gate.get("error", ""))[:200])
                log.warning("the new pod's tritonserver died before its gate passed; restarted (%s)", pod_restarts[-1])
                victim.server.stop()
                victim.server.start()
            time.sleep(1.0)
        assert code == 0 and gate["ready"] and [m["serving"] for m in gate["models"]] == [2], gate
        t_gate = time.monotonic()
        victim.gated = True
        _wait("the new pod in the Service", lambda: victim_index in service.ready(), 10)
        t_back, errors_at_back = time.monotonic(), errors()
        victim_before = sum(t.by_replica[victim_index] for t in tallies)
        _wait(
            f"{NEW_POD_ANSWERS} answers from the new pod",
            lambda: sum(t.by_replica[victim_index] for t in tallies) >= victim_before + NEW_POD_ANSWERS,
            30,
        )

        # 3. the load runs on until enough requests were answered
        _wait(f"{TARGET} answers", lambda: answered() >= TARGET, 180)
    finally:
        stop.set()
        service.stop.set()
        for thread in threads:
            thread.join(timeout=30)
    t_end = time.monotonic()
    total = _merged(tallies)

    first_v2 = min((end for (_, v), (end, _) in total.seen.items() if v == 2), default=t_end)
    last_v1 = max((start for (_, v), (_, start) in total.seen.items() if v == 1), default=t_start)
    by_version: Counter[int] = Counter()
    for (version, _, _), n in total.answers.items():
        by_version[version] += n
    figures = {
        "replicas": len(replicas),
        "clients": CLIENTS,
        "probe_period_s": PROBE_PERIOD,
        "requests": total.sent,
        "new_pod_restarts_before_ready": pod_restarts,
        "answered": total.answered,
        "failed": len(total.failed),
        "first_attempt_errors": dict(total.first_errors),
        "retried_and_answered": total.retried_ok,
        "first_attempt_error_samples": total.samples,
        "latency_ms": {
            "p50": round(1000 * statistics.median(total.latencies), 2),
            "p99": round(1000 * _percentile(total.latencies, 0.99), 2),
            "max": round(1000 * max(total.latencies), 2),
        },
        "seconds": round(t_end - t_start, 1),
        "answers_per_s": round(total.answered / (t_end - t_start), 1),
        "answered_by_replica": {fleet.servers[i].config.grpc_url: n for i, n in sorted(total.by_replica.items())},
        "answered_by_version": dict(sorted(by_version.items())),
        "release": {
            "wall_s": round(release_s, 1),
            "steps_s": {name: round(r["seconds"], 2) for name, r in steps.items()},
            "answered_during": at_release_end - at_release_start,
            "first_attempt_errors_during": errors_at_release_end - errors_before,
            "first_v2_answer_after_start_s": round(first_v2 - t_release, 2),
            "last_v1_request_after_start_s": round(last_v1 - t_release, 2),
            "switched_after_start_s": {
                fleet.servers[i].config.grpc_url: round(total.seen[i, 2][0] - t_release, 2)
                for i in range(len(replicas))
                if (i, 2) in total.seen and (i, 1) in total.seen
            },
        },
        "replica_kill": {
            "out_of_service_after_s": round(t_out - t_kill, 2),
            "restarted_live_after_s": round(t_live - t_kill, 2),
            "readiness_gate_passed_after_s": round(t_gate - t_kill, 2),
            "replica_ready_reconcile_s": round(gate["seconds"], 2),
            "back_in_service_after_s": round(t_back - t_kill, 2),
            "first_attempt_errors_kill_to_back": errors_at_back - errors_at_release_end,
            "answered_by_the_new_pod": total.by_replica[victim_index] - victim_before,
            "before_its_gate_a_direct_request_got": ungated,
        },
        "service_changes": [(round(t - t_start, 2), list(ready)) for t, ready in service.changes],
    }
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(json.dumps(figures, indent=1, ensure_ascii=False), encoding="utf-8")
    print("\n" + json.dumps(figures, indent=1, ensure_ascii=False))

    assert not total.failed, f"{len(total.failed)} failed, e.g. {total.failed[:5]}"
    # every answer: a version served then, labels of its label set, a golden text's validated labels
    versions = {v for _, v in total.seen}
    assert versions == {1, 2}, total.seen
    assert last_v1 < t_released, "version 1 answered a request sent after the release finished"
    assert first_v2 > t_release, "version 2 answered before the release started"
    for i in range(len(replicas)):  # each replica switches once: no version 1 after its first version 2
        if (i, 1) in total.seen and (i, 2) in total.seen:
            assert total.seen[i, 1][1] < total.seen[i, 2][0], f"replica {i} answered version 1 after version 2"
    golden = {v: _labels_by_text(e) for v, e in expected.items()}
    wrong = [
        (version, texts[index], labels, n)
        for (version, index, labels), n in total.answers.items()
        if not set(labels) <= set(expected[version].labels)
        or golden[version].get(texts[index], list(labels)) != list(labels)
    ]
    assert not wrong, wrong[:5]
    assert total.answered >= TARGET, figures
    assert errors_at_back > errors_at_release_end, "no client met the dead replica: the kill proved nothing"
    (st,) = status(fleet.settings(), [MODEL])
    assert st.agree and st.recorded["serving"] == 2 and len(st.endpoints) == 3, st.lines()
