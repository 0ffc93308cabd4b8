"""Measurements: gRPC load against Triton, Triton's own statistics, process CPU/RSS, in-process limits.

Every loop is bounded twice — by a request count and by a deadline — so a slow or stuck server
cannot stretch a run. Loopback only (the URL comes from the local server the benchmark started).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.contract.names import ENSEMBLE

ROLES = ("server", "tokenizer", "seqcls_model", "seqcls_postprocess", "other")


def percentiles(values_ms: Sequence[float]) -> dict[str, float | None]:
    if not len(values_ms):
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    a = np.asarray(values_ms, dtype=np.float64)
    return {f"p{q}_ms": round(float(np.percentile(a, q)), 2) for q in (50, 95, 99)}


# ----------------------------------------------------------------------------- processes


def _role(proc) -> str:
    try:
        cmd = " ".join(proc.cmdline())
    except Exception:
        return "other"
    if "tritonserver" in cmd and "python_backend_stub" not in cmd:
        return "server"
    for model in ("seqcls_postprocess", "seqcls_model", "tokenizer"):  # longest names first
        if f"/{model}/" in cmd:
            return model
    return "other"


@dataclass
class ProcessSnapshot:
    """CPU seconds and RSS of the Triton server and every python-backend stub, by role."""

    cpu: dict[int, float] = field(default_factory=dict)
    roles: dict[int, str] = field(default_factory=dict)
    rss: dict[int, int] = field(default_factory=dict)
    taken: float = 0.0

    @classmethod
    def take(cls, server_pid: int | None) -> ProcessSnapshot:
        import psutil

        snap = cls(taken=time.perf_counter())
        if server_pid is None:
            return snap
        try:
            root = psutil.Process(server_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return snap
        for proc in procs:
            try:
                times = proc.cpu_times()
                snap.cpu[proc.pid] = times.user + times.system
                snap.rss[proc.pid] = proc.memory_info().rss
                snap.roles[proc.pid] = _role(proc)
            except psutil.Error:
                continue
        return snap

    def rss_by_role(self) -> dict[str, dict[str, float]]:
        """Per role: number of processes, largest and total RSS (MB)."""
        out: dict[str, dict[str, float]] = {}
        for pid, rss in self.rss.items():
            role = self.roles.get(pid, "other")
            entry = out.setdefault(role, {"processes": 0, "max_rss_mb": 0.0, "total_rss_mb": 0.0})
            entry["processes"] += 1
            entry["max_rss_mb"] = round(max(entry["max_rss_mb"], rss / 1e6), 1)
            entry["total_rss_mb"] = round(entry["total_rss_mb"] + rss / 1e6, 1)
        return out


def cpu_between(before: ProcessSnapshot, after: ProcessSnapshot) -> dict[str, float]:
    """CPU cores used per role between two snapshots (CPU seconds / wall seconds)."""
    wall = max(after.taken - before.taken, 1e-9)
    out = dict.fromkeys(ROLES, 0.0)
    for pid, cpu in after.cpu.items():
        out[after.roles.get(pid, "other")] += cpu - before.cpu.get(pid, 0.0)
    cores = {role: round(value / wall, 3) for role, value in out.items()}
    cores["total"] = round(sum(out.values()) / wall, 3)
    return cores


def self_cpu() -> float:
    t = os.times()
    return t.user + t.system


# ----------------------------------------------------------------------------- Triton statistics


def triton_counts(url: str, models: Sequence[str] = ("tokenizer", "seqcls_model")) -> dict[str, tuple[int, int]]:
    """(inference_count, execution_count) per model, summed over its loaded versions."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=url)
    out: dict[str, tuple[int, int]] = {}
    try:
        for model in models:
            stats = client.get_inference_statistics(model_name=model, as_json=True)
            inf = sum(int(s.get("inference_count", 0)) for s in stats.get("model_stats", []))
            exe = sum(int(s.get("execution_count", 0)) for s in stats.get("model_stats", []))
            out[model] = (inf, exe)
    finally:
        client.close()
    return out


def batch_between(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, float | None]:
    """Average executed batch (texts per ``execute`` call) per model between two snapshots."""
    out: dict[str, float | None] = {}
    for model, (inf, exe) in after.items():
        b_inf, b_exe = before.get(model, (0, 0))
        out[model] = round((inf - b_inf) / (exe - b_exe), 2) if exe > b_exe else None
    return out


# ----------------------------------------------------------------------------- gRPC load


@dataclass
class LoadResult:
    clients: int
    texts_per_request: int
    requests: int
    texts: int
    failed: int
    seconds: float
    latencies_ms: list[float]
    errors: list[str]

    def summary(self) -> dict[str, Any]:
        return {
            "clients": self.clients,
            "texts_per_request": self.texts_per_request,
            "requests": self.requests,
            "texts": self.texts,
            "failed": self.failed,
            "seconds": round(self.seconds, 3),
            "sentences_per_s": round(self.texts / self.seconds, 2) if self.seconds > 0 else 0.0,
            **percentiles(self.latencies_ms),
            "errors": self.errors[:3],
        }


def _request_inputs(batch: Sequence[str]):
    import tritonclient.grpc as grpcclient

    data = np.array([[t.encode("utf-8")] for t in batch], dtype=object)
    inp = grpcclient.InferInput("TEXT", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    return [inp]


Sender = Callable[[], AbstractContextManager[Callable[[list[str]], Any]]]


def run_load(
    url: str,
    texts: Sequence[str],
    *,
    clients: int,
    texts_per_request: int,
    max_requests: int,
    max_seconds: float,
    stop: threading.Event | None = None,
    offset: int = 0,
    timeout: float = 60.0,
    model: str = ENSEMBLE,
) -> LoadResult:
    """``clients`` threads, each with its own gRPC client, send requests to ``model`` back to back until
    ``max_requests`` were sent in total, ``max_seconds`` passed, or ``stop`` is set."""
    import tritonclient.grpc as grpcclient

    outputs = [grpcclient.InferRequestedOutput("predictions")]

    @contextmanager
    def grpc_sender() -> Iterator[Callable[[list[str]], Any]]:
        client = grpcclient.InferenceServerClient(url=url)
        try:
            yield lambda batch: client.infer(model, _request_inputs(batch), outputs=outputs, client_timeout=timeout)
        finally:
            client.close()

    return drive(
        grpc_sender,
        texts,
        clients=clients,
        texts_per_request=texts_per_request,
        max_requests=max_requests,
        max_seconds=max_seconds,
        stop=stop,
        offset=offset,
        join_timeout=max_seconds + timeout + 30,
    )


def drive(
    sender: Sender,
    texts: Sequence[str],
    *,
    clients: int,
    texts_per_request: int,
    max_requests: int,
    max_seconds: float,
    stop: threading.Event | None = None,
    offset: int = 0,
    join_timeout: float | None = None,
) -> LoadResult:
    """``clients`` threads, each with its own ``sender()`` (a context giving a send function), send
    ``texts_per_request`` texts at a time back to back, bounded like :func:`run_load`. A failed
    send is counted and its error kept, never fatal for the run."""
    n = len(texts)
    lock = threading.Lock()
    state = {"issued": 0}
    latencies: list[list[float]] = [[] for _ in range(clients)]
    done_texts = [0] * clients
    failed = [0] * clients
    errors: list[str] = []
    start_barrier = threading.Barrier(clients + 1)
    deadline_box: list[float] = [0.0]

    def worker(k: int) -> None:
        with sender() as send:
            start_barrier.wait()
            while True:
                with lock:
                    i = state["issued"]
                    if i >= max_requests:
                        return
                    state["issued"] = i + 1
                if time.perf_counter() >= deadline_box[0] or (stop is not None and stop.is_set()):
                    return
                first = (offset + i * texts_per_request) % n
                batch = [texts[(first + j) % n] for j in range(texts_per_request)]
                t0 = time.perf_counter()
                try:
                    send(batch)
                    latencies[k].append((time.perf_counter() - t0) * 1000.0)
                    done_texts[k] += len(batch)
                except Exception as exc:  # counted and reported, never fatal for the run
                    failed[k] += 1
                    with lock:
                        if len(errors) < 10:
                            errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    t_start = time.perf_counter()
    deadline_box[0] = t_start + max_seconds
    start_barrier.wait()
    for t in threads:
        t.join(timeout=join_timeout)
    seconds = time.perf_counter() - t_start
    lat = [x for per in latencies for x in per]
    return LoadResult(
        clients=clients,
        texts_per_request=texts_per_request,
        requests=len(lat) + sum(failed),
        texts=sum(done_texts),
        failed=sum(failed),
        seconds=seconds,
        latencies_ms=lat,
        errors=errors,
    )


# ----------------------------------------------------------------------------- in process


def ort_sessions(
    model_file: Path, *, workers: int, intra_op_threads: int, graph_level: str, profile: str = "fp32"
) -> list:
    """One session per worker, as ``seqcls_model`` opens it: ONNX Runtime, or ``profile``'s engine (bf16)."""
    import onnxruntime as ort

    from seqcls.contract import shipped

    engine = shipped.engine()
    if profile in engine.ENGINES:
        return [engine.session(model_file, profile, intra_op_threads) for _ in range(workers)]

    levels = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    sessions = []
    for _ in range(workers):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = levels[graph_level]
        sessions.append(ort.InferenceSession(str(model_file), sess_options=opts, providers=["CPUExecutionProvider"]))
    return sessions


def inprocess_limit(
    sessions: Sequence,
    encode: Callable[[list[str]], list[list[int]]],
    pad: Callable[[list[list[int]]], tuple[np.ndarray, np.ndarray]],
    texts: Sequence[str],
    *,
    batch_size: int,
    max_seconds: float,
    max_batches: int,
    per_text: bool = False,
) -> dict[str, Any]:
    """Sentences/s of tokenize → pad to the batch's longest → ORT, one thread per session
    (the layout of the served model's instances), no server in between. ``per_text`` runs each
    text of a batch on its own (no padding at all) instead. Also reports the CPU milliseconds
    this process spent per sentence — unlike sentences/s, that does not depend on how much of
    the machine other work is using."""
    n = len(texts)
    lock = threading.Lock()
    state = {"issued": 0}
    done = [0] * len(sessions)
    latencies: list[list[float]] = [[] for _ in sessions]
    barrier = threading.Barrier(len(sessions) + 1)
    deadline_box = [0.0]

    def worker(k: int) -> None:
        session = sessions[k]
        barrier.wait()
        while True:
            with lock:
                i = state["issued"]
                if i >= max_batches:
                    return
                state["issued"] = i + 1
            if time.perf_counter() >= deadline_box[0]:
                return
            batch = [texts[(i * batch_size + j) % n] for j in range(batch_size)]
            t0 = time.perf_counter()
            encoded = encode(batch)
            for rows in [[x] for x in encoded] if per_text else [encoded]:
                ids, types = pad(rows)
                session.run(["logits"], {"input_ids": ids, "token_type_ids": types})
            latencies[k].append((time.perf_counter() - t0) * 1000.0)
            done[k] += len(batch)

    # warm-up: each session once, and on one text of every token length (an engine such as OpenVINO pays a
    # first-time cost per input length: timed cold, those runs pulled its limit down)
    firsts = {len(x): x for x in reversed(encode(list(texts)))}
    for session in sessions:
        for rows in [encode(list(texts[:batch_size])), *([x] for x in firsts.values())]:
            ids, types = pad(rows)
            session.run(["logits"], {"input_ids": ids, "token_type_ids": types})
    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(len(sessions))]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    cpu0 = self_cpu()
    deadline_box[0] = t0 + max_seconds
    barrier.wait()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    cpu = self_cpu() - cpu0
    lat = [x for per in latencies for x in per]
    return {
        "batch_size": batch_size,
        "per_text": per_text,
        "workers": len(sessions),
        "cpu_ms_per_sentence": round(1000.0 * cpu / sum(done), 2) if sum(done) else None,
        "texts": sum(done),
        "seconds": round(seconds, 3),
        "sentences_per_s": round(sum(done) / seconds, 2) if seconds > 0 else 0.0,
        **percentiles(lat),
    }


def tokenizer_throughput(
    encode: Callable[[list[str]], Any], texts: Sequence[str], *, batch_size: int, max_seconds: float, max_texts: int
) -> dict[str, Any]:
    n = len(texts)
    done, i = 0, 0
    encode(list(texts[:batch_size]))  # warm-up
    t0 = time.perf_counter()
    cpu0 = self_cpu()  # the whole process: HF tokenizers encodes a batch on its own Rust threads
    while done < max_texts and time.perf_counter() - t0 < max_seconds:
        batch = [texts[(i + j) % n] for j in range(batch_size)]
        encode(batch)
        done += batch_size
        i += batch_size
    seconds = time.perf_counter() - t0
    cpu = self_cpu() - cpu0
    return {
        "batch_size": batch_size,
        "texts": done,
        "seconds": round(seconds, 3),
        "sentences_per_s": round(done / seconds, 1) if seconds > 0 else 0.0,
        "sentences_per_cpu_s": round(done / cpu, 1) if cpu > 0 else None,
    }
