"""Which serving layout (model instances × ORT threads) is fastest on *this* Triton host?

Which one wins depends on the host — its cores, what else runs there — so it is measured on the
target Triton rather than guessed. For each candidate layout (by default every
``instances × threads = cores`` split) a throwaway copy of the model's ONNX stage,
``<m>_model.layout-IxT``, is loaded with Triton's load-with-override API: config and files are
sent with the request, nothing is written into the repository, no ensemble routes to it, so
neither unpinned clients nor the candidate route ever reach it. It is timed with single-text
requests from ``clients`` concurrent clients and then from one client (p95), and unloaded.

The layout chosen is the highest throughput whose one-client p95 stays within ``p95_slack`` of
the best p95 (on 2 cores, 2×1 can match 1×2's throughput yet nearly double a lone request's
latency). It is applied the way an explicit choice is: ``SEQCLS_SERVING_LAYOUT`` (Airflow: the
worker's environment), which every release rendered afterwards uses.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.contract import shipped
from seqcls.errors import InputError, ServingError
from seqcls.serving.client import TritonOps, endpoints_from_settings, retrying
from seqcls.serving.repository import SNAPSHOT, parse_config
from seqcls.serving.state import current_state
from seqcls.settings import ENV_SERVING_LAYOUT, Settings, parse_layout

log = logging.getLogger(__name__)

TRIAL_SUFFIX = ".layout-"  # '.' cannot start a role suffix, so no seqcls model's names end like this


@dataclass(frozen=True)
class LayoutTrial:
    """One layout's measurement on the target Triton."""

    layout: str
    sentences_per_s: float
    p95_ms: float
    requests: int
    failed: int
    load_seconds: float


@dataclass
class LayoutCalibration:
    """All trials and the choice; :meth:`lines` is what the CLI prints."""

    model_name: str
    version: int
    endpoint: str
    clients: int
    lengths: tuple[int, int]
    trials: list[LayoutTrial] = field(default_factory=list)
    chosen: str = ""
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["setting"] = f"{ENV_SERVING_LAYOUT}={self.chosen}"
        return d

    def lines(self) -> list[str]:
        out = [
            f"{self.model_name} version {self.version} on {self.endpoint}: {self.clients} clients, single texts of "
            f"{self.lengths[0]}–{self.lengths[1]} tokens",
            f"  {'layout':8s} {'sentences/s':>12s} {'1-client p95 ms':>16s} {'failed':>7s}",
        ]
        for t in self.trials:
            mark = "  ← chosen" if t.layout == self.chosen else ""
            out.append(f"  {t.layout:8s} {t.sentences_per_s:12.1f} {t.p95_ms:16.1f} {t.failed:7d}{mark}")
        out += [f"chosen: {self.chosen} ({self.why})", f"apply it: export {ENV_SERVING_LAYOUT}={self.chosen}"]
        return out


def candidate_layouts(cores: int) -> list[str]:
    """Every ``IxT`` with ``I × T = cores`` (2 → 1x2, 2x1)."""
    if cores < 1:
        raise InputError(f"cores must be at least 1, not {cores}")
    return [f"{i}x{cores // i}" for i in range(1, cores + 1) if cores % i == 0]


def choose(trials: list[LayoutTrial], p95_slack: float = 1.25) -> tuple[LayoutTrial, str]:
    """The fastest trial whose lone-request p95 is within ``p95_slack`` × the best p95."""
    ok = [t for t in trials if t.failed == 0]
    if not ok:
        raise ServingError("every layout trial had failed requests; see the Triton log")
    best_p95 = min(t.p95_ms for t in ok)
    within = [t for t in ok if t.p95_ms <= p95_slack * best_p95]
    pick = max(within, key=lambda t: t.sentences_per_s)
    fastest = max(ok, key=lambda t: t.sentences_per_s)
    if pick is fastest:
        return pick, f"highest throughput, 1-client p95 within {p95_slack:.2f}× the best"
    return pick, (
        f"{fastest.layout} is {fastest.sentences_per_s / pick.sentences_per_s:.2f}× faster but its 1-client p95 "
        f"{fastest.p95_ms:.0f} ms is over {p95_slack:.2f}× the best {best_p95:.0f} ms"
    )


def _trial_config(snapshot: str, name: str, layout: str) -> str:
    """The version's own config as JSON (what load-with-override takes), renamed and re-laid-out."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2

    instances, threads = parse_layout(layout)
    config = parse_config(snapshot, SNAPSHOT)
    config.name = name
    config.ClearField("version_policy")
    del config.instance_group[:]
    config.instance_group.add(count=instances, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    config.parameters["intra_op_threads"].string_value = str(threads)
    return json_format.MessageToJson(config)


def _vocab_size(tokenizer_dir: Path) -> int:
    release = json.loads((tokenizer_dir / "release.json").read_text(encoding="utf-8"))
    path = tokenizer_dir / Path(str(release.get("tokenizer_file", "vocab.txt"))).name
    if path.suffix == ".json":
        return len(json.loads(path.read_text(encoding="utf-8"))["model"]["vocab"])
    return sum(1 for _ in path.open(encoding="utf-8"))


def _requests(
    settings: Settings, inputs: list[str], vocab: int, lengths: tuple[int, int], n: int = 64
) -> list[dict[str, np.ndarray]]:
    """Seeded single-text feeds of the given lengths, built as the tokenizer model builds them
    (layout cost depends on shapes, not words)."""
    rng = np.random.default_rng(0)
    text = shipped.text(settings)
    seqs = [
        rng.integers(min(5, vocab - 1), vocab, size=int(rng.integers(lengths[0], lengths[1] + 1))).tolist()
        for _ in range(n)
    ]
    return [text.model_feeds([ids], inputs, max_length=lengths[1]) for ids in seqs]


def _drive(op: TritonOps, model: str, batches: list[dict[str, np.ndarray]], clients: int, seconds: float) -> dict:
    """``clients`` threads send requests for ``seconds``; returns counts and latencies (ms)."""
    import tritonclient.grpc as grpcclient

    stop, lock = time.monotonic() + seconds, threading.Lock()
    done: list[float] = []
    failed = [0]

    def inputs(feeds: dict[str, np.ndarray]) -> list:
        out = []
        for name, arr in feeds.items():
            inp = grpcclient.InferInput(name, list(arr.shape), "INT64")
            inp.set_data_from_numpy(arr)
            out.append(inp)
        return out

    def client(k: int) -> None:
        c = grpcclient.InferenceServerClient(url=op.endpoint.grpc)
        prepared = [inputs(f) for f in batches]  # once per client: the timed loop only sends
        i = k
        while time.monotonic() < stop:
            ins = prepared[i % len(prepared)]
            i += clients
            t0 = time.perf_counter()
            try:
                c.infer(model, ins, client_timeout=op.request_timeout)
            except Exception:
                with lock:
                    failed[0] += 1
                continue
            with lock:
                done.append((time.perf_counter() - t0) * 1000)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"n": len(done), "failed": failed[0], "seconds": time.perf_counter() - t0, "ms": done}


def _p95(ms: list[float]) -> float:
    return float(np.percentile(ms, 95)) if ms else float("inf")


def trial(op: TritonOps, repo: Path, model: str, version: int, layout: str, batches, clients: int, seconds: float):
    """Load ``model``'s version under ``layout`` as a throwaway model, time it, unload it."""
    vdir = repo / model / str(version)
    name = f"{model}{TRIAL_SUFFIX}{layout}"
    files = {f"file:1/{p.name}": p.read_bytes() for p in sorted(vdir.iterdir()) if p.is_file()}
    config = _trial_config((vdir / SNAPSHOT).read_text(encoding="utf-8"), name, layout)
    t0 = time.perf_counter()
    where = f"layout trial {name!r} on {op.endpoint.grpc}"
    retrying(f"load {where}", lambda: op.client.load_model(name, config=config, files=files, client_timeout=op.timeout))
    loaded = time.perf_counter() - t0
    try:
        _drive(op, name, batches, 1, min(1.0, seconds / 3))  # warm-up: first runs allocate
        many = _drive(op, name, batches, clients, seconds)
        one = _drive(op, name, batches, 1, seconds)
    finally:
        op.unload(name)
    result = LayoutTrial(
        layout=layout,
        sentences_per_s=round(many["n"] / many["seconds"], 1),
        p95_ms=round(_p95(one["ms"]), 1),
        requests=many["n"] + one["n"],
        failed=many["failed"] + one["failed"],
        load_seconds=round(loaded, 2),
    )
    log.info(
        "layout %s: %.1f sentences/s at %d clients, 1-client p95 %.1f ms, %d failed (loaded in %.1fs)",
        layout,
        result.sentences_per_s,
        clients,
        result.p95_ms,
        result.failed,
        loaded,
    )
    return result


def loaded_models(op: TritonOps) -> set[str]:
    """Every model Triton has loaded, including ones loaded with override files (statistics API)."""
    stats = retrying(
        f"statistics on {op.endpoint.grpc}",
        lambda: op.client.get_inference_statistics(as_json=True, client_timeout=op.request_timeout),
    )
    return {m["name"] for m in stats.get("model_stats", [])}


def _unload_stale(op: TritonOps, model: str) -> None:
    """Trials a killed calibration left loaded (they hold memory and cores) are unloaded first.

    A model loaded with override files is not in the repository index; the statistics list it."""
    for name in sorted(loaded_models(op)):
        if name.startswith(f"{model}{TRIAL_SUFFIX}") and op.ready(name):
            log.warning("unloading %s, left loaded by an earlier calibration", name)
            op.unload(name)


def calibrate_layout(
    settings: Settings,
    model_name: str,
    *,
    layouts: list[str] | None = None,
    cores: int | None = None,
    clients: int = 8,
    seconds: float = 5.0,
    lengths: tuple[int, int] = (16, 64),
    p95_slack: float = 1.25,
) -> LayoutCalibration:
    """Measure each layout on the first endpoint with the candidate version (else the served one)."""
    names = model_name.names
    repo = Path(str(settings.triton_repository))
    state = current_state(repo, model_name)
    version = state.candidate if state.candidate is not None else state.serving
    if version is None:
        raise InputError(f"{model_name!r} has no published candidate or served version to calibrate; release it first")
    for layout in layouts or []:
        try:
            parse_layout(layout)
        except InputError:
            raise InputError(f"layout {layout!r}: expected INSTANCESxTHREADS, e.g. 1x2 or 2x1") from None
    layouts = layouts or candidate_layouts(cores or len(os.sched_getaffinity(0)))
    if not 1 <= lengths[0] <= lengths[1]:
        raise InputError(f"lengths {lengths[0]}-{lengths[1]}: expected 1 <= MIN <= MAX")
    op = TritonOps(endpoints_from_settings(settings)[0])
    op.require_live()
    _unload_stale(op, names.model)
    release = json.loads((repo / names.model / str(version) / "release.json").read_text(encoding="utf-8"))
    inputs = list(release.get("model_inputs") or shipped.contract(settings).MODEL_INPUTS)
    batches = _requests(settings, inputs, _vocab_size(repo / names.tokenizer / str(version)), lengths)
    cal = LayoutCalibration(model_name, version, op.endpoint.grpc, clients, lengths)
    t0 = time.perf_counter()
    log.info("calibrating %s version %d: layouts %s, %.0f s each", model_name, version, ", ".join(layouts), seconds)
    for layout in layouts:
        cal.trials.append(trial(op, repo, names.model, version, layout, batches, clients, seconds))
    pick, cal.why = choose(cal.trials, p95_slack)
    cal.chosen = pick.layout
    log.info("layout calibration of %s: %s in %.0fs (%s)", model_name, cal.chosen, time.perf_counter() - t0, cal.why)
    return cal


__all__ = ["LayoutCalibration", "LayoutTrial", "calibrate_layout", "candidate_layouts", "choose", "loaded_models"]
