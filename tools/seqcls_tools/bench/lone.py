"""Where a lone request's time goes: N sequential single-text requests, one client, split by Triton's own statistics.

Triton counts, per model, the nanoseconds its requests spent queued and in ``compute_input`` /
``compute_infer`` / ``compute_output`` (``get_inference_statistics``; cumulative, so the bench reads
them before and after and divides the difference by the requests sent). Per request:

- each composing model (tokenizer → model → postprocess): its own work, queue + compute_input +
  compute_infer — for a python-backend model ``compute_infer`` includes the round trip to its stub
  process (shared memory + message queue), so a stub's own Python work is only part of it;
- the rest of the client's latency: **hand-offs + ensemble scheduling + gRPC + IPC**. A model's
  ``compute_output`` ends only after its response was sent, and sending it runs the ensemble's next
  step (for the last step, the reply to the client), so the hand-offs show up there. Counted in the
  models they overlap the next step, and the composing sum can exceed the client's latency. A model's own part
  ends at ``compute_end``, before its response is sent, so the own parts do not overlap each other
  and lie inside the client's span: the remainder is ≥ 0 by construction. Of the remainder, the
  models' ``compute_output`` sum and the time outside the ensemble (client latency − the ensemble's
  own total) are reported too; the latter can be < 0, since the ensemble's span ends only after its
  reply was handed to the gRPC server.

Beside it the same work in process, one text at a time: the serving tokenizer, the served ONNX
model in an ONNX Runtime session of the served thread layout, sigmoid + decide — the lone
request's in-process limit, timed in blocks alternating with the served requests so that the
machine's other load drifts over both alike. The functions on statistics are plain (JSON in,
numbers out); the measuring ones take the gRPC URL and the in-process steps they time.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

#: Triton's per-model duration statistics that make up a request's time in that model.
PARTS = ("queue", "compute_input", "compute_infer", "compute_output")
#: The ones that are the model's own work: they end before its response is sent (module docstring).
OWN = PARTS[:3]
REMAINDER = "hand-offs + ensemble scheduling + gRPC + IPC"

Stats = dict[str, dict[str, tuple[int, int]]]  # model -> statistic -> (count, ns)


def parse_statistics(stats: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """(count, ns) of ``success`` and each of :data:`PARTS` from one model's
    ``get_inference_statistics(as_json=True)``, summed over its versions (protobuf's JSON writes
    64-bit numbers as strings and leaves zeros out)."""
    out = dict.fromkeys(("success", *PARTS), (0, 0))
    for version in stats.get("model_stats", []):
        inference = version.get("inference_stats", {})
        for key in out:
            entry = inference.get(key, {})
            count, ns = out[key]
            out[key] = (count + int(entry.get("count", 0)), ns + int(entry.get("ns", 0)))
    return out


def snapshot(url: str, models: Sequence[str]) -> Stats:
    """:func:`parse_statistics` of each of ``models`` on the server at ``url`` (gRPC)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=url)
    try:
        return {m: parse_statistics(client.get_inference_statistics(model_name=m, as_json=True)) for m in models}
    finally:
        client.close()


def _delta_ms(before: Stats, after: Stats, model: str, key: str, requests: int) -> float:
    return (after[model][key][1] - before[model][key][1]) / 1e6 / requests


def breakdown(
    before: Stats, after: Stats, latencies_ms: Sequence[float], *, ensemble: str, composing: Sequence[str]
) -> dict[str, Any]:
    """Per request (means over the ``len(latencies_ms)`` requests between the snapshots): the client's
    latency, the ensemble's total, each composing model's :data:`PARTS`, and the remainder. ``parts``
    lists the composing models' own work (:data:`OWN`) and the remainder with their share of the
    client's mean latency; they sum to it. Requests counted by Triton are reported beside the client's
    count."""
    n = len(latencies_ms)
    if n == 0:
        raise ValueError("no successful request to break down")
    client = np.asarray(latencies_ms, dtype=np.float64)
    mean = float(client.mean())
    models: dict[str, dict[str, Any]] = {}
    for model in composing:
        entry: dict[str, Any] = {f"{p}_ms": round(_delta_ms(before, after, model, p, n), 4) for p in PARTS}
        entry["own_ms"] = round(sum(_delta_ms(before, after, model, p, n) for p in OWN), 4)
        entry["requests"] = after[model]["success"][0] - before[model]["success"][0]
        models[model] = entry
    own = sum(m["own_ms"] for m in models.values())
    ensemble_ms = _delta_ms(before, after, ensemble, "success", n)
    parts = [{"part": m, "ms": models[m]["own_ms"]} for m in composing]
    parts.append({"part": REMAINDER, "ms": round(mean - own, 4)})
    for part in parts:
        part["share"] = round(part["ms"] / mean, 4) if mean > 0 else None
    return {
        "requests": n,
        "ensemble_requests": after[ensemble]["success"][0] - before[ensemble]["success"][0],
        "client_mean_ms": round(mean, 4),
        "client_p50_ms": round(float(np.percentile(client, 50)), 4),
        "client_p95_ms": round(float(np.percentile(client, 95)), 4),
        "ensemble_ms": round(ensemble_ms, 4),
        "models": models,
        "parts": parts,
        "remainder": {
            "hand_offs_ms": round(sum(m["compute_output_ms"] for m in models.values()), 4),
            # can be < 0: the ensemble's span ends after its reply was handed over (module docstring)
            "outside_ensemble_ms": round(mean - ensemble_ms, 4),
        },
    }


def send_sequential(
    url: str,
    model: str,
    texts: Sequence[str],
    requests: int,
    *,
    between: Callable[[int, int], None] | None = None,
    block: int = 10,
    timeout: float = 60.0,
) -> list[float]:
    """``requests`` single-text requests to ``model``, one after the other from one client; their
    latencies in ms (a failed request raises: a lone request that fails is a broken server). After
    every ``block`` requests ``between(first, count)`` runs, if given: the in-process side, so that
    the machine's other load drifts over both alike."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=url)
    outputs = [grpcclient.InferRequestedOutput("predictions")]
    latencies = []
    try:
        for first in range(0, requests, block):
            count = min(block, requests - first)
            for i in range(first, first + count):
                data = np.array([[texts[i % len(texts)].encode("utf-8")]], dtype=object)
                inp = grpcclient.InferInput("TEXT", list(data.shape), "BYTES")
                inp.set_data_from_numpy(data)
                t0 = time.perf_counter()
                client.infer(model, [inp], outputs=outputs, client_timeout=timeout)
                latencies.append((time.perf_counter() - t0) * 1000.0)
            if between is not None:
                between(first, count)
    finally:
        client.close()
    return latencies


def settled(url: str, before: Stats, models: Sequence[str], requests: int, timeout: float = 5.0) -> Stats:
    """The statistics once every model has counted ``requests`` more successes: Triton updates a model's
    statistics as its response is released, which can come after the client already has the answer."""
    deadline = time.monotonic() + timeout
    while True:
        after = snapshot(url, models)
        done = all(after[m]["success"][0] - before[m]["success"][0] >= requests for m in models)
        if done or time.monotonic() >= deadline:
            return after
        time.sleep(0.02)


def time_steps(steps: Mapping[str, Callable[[Any], Any]], text: str) -> list[float]:
    """ms of each of ``steps`` (name → function, each fed the previous one's result, the first a
    one-text list) on ``text``."""
    value: Any = [text]
    marks = [time.perf_counter()]
    for fn in steps.values():
        value = fn(value)
        marks.append(time.perf_counter())
    return [(b - a) * 1000.0 for a, b in itertools.pairwise(marks)]


def summarize_steps(names: Sequence[str], runs: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Mean ms per step, and the total's mean and p50, of :func:`time_steps` results."""
    a = np.asarray(runs, dtype=np.float64)
    totals = a.sum(axis=1)
    return {
        "requests": len(a),
        "steps_ms": {name: round(float(a[:, k].mean()), 4) for k, name in enumerate(names)},
        "mean_ms": round(float(totals.mean()), 4),
        "p50_ms": round(float(np.percentile(totals, 50)), 4),
    }


def served_and_in_process(
    url: str,
    steps: Mapping[str, Callable[[Any], Any]],
    texts: Sequence[str],
    requests: int,
    *,
    ensemble: str,
    composing: Sequence[str],
    block: int = 10,
    warm: Sequence[str] = (),
) -> dict[str, Any]:
    """The served requests (:func:`send_sequential` between two statistics snapshots, the second
    :func:`settled` → :func:`breakdown`) and the same texts in process, in alternating blocks of
    ``block``; both, and :func:`compare`. ``warm``: texts run in process untimed first (one of each
    token length: an engine such as OpenVINO pays a first-time cost per length)."""
    models = (*composing, ensemble)
    runs: list[list[float]] = []

    def between(first: int, count: int) -> None:
        runs.extend(time_steps(steps, texts[i % len(texts)]) for i in range(first, first + count))

    for text in warm or texts[:1]:  # warm-up: the server was warmed by its caller
        time_steps(steps, text)
    before = snapshot(url, models)
    latencies = send_sequential(url, ensemble, texts, requests, between=between, block=block)
    after = settled(url, before, models, len(latencies))
    out = {
        "served": breakdown(before, after, latencies, ensemble=ensemble, composing=composing),
        "inprocess": summarize_steps(list(steps), runs),
        "interleaved_blocks": block,
    }
    out["served_over_inprocess"] = compare(out["served"], out["inprocess"])
    return out


def ceiling(inprocess_ms: float, floor_ms: float) -> float:
    """The best lone speed a python model could reach for ``inprocess_ms`` of work when an empty python model's
    lone request takes ``floor_ms``: in process / (in process + floor)."""
    return round(inprocess_ms / (inprocess_ms + floor_ms), 3)


def compare(served_result: dict[str, Any], inprocess_result: dict[str, Any]) -> dict[str, Any]:
    """Served over in-process, by p50 and by mean (> 1: serving costs that much more per lone text)."""
    return {
        "p50": round(served_result["client_p50_ms"] / inprocess_result["p50_ms"], 2),
        "mean": round(served_result["client_mean_ms"] / inprocess_result["mean_ms"], 2),
    }
