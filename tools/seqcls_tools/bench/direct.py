"""The *direct* layout, measured: one python model running a published version's three steps in one stub.

``model_repository/seqcls_direct/model.py`` runs the tokenizer, ``seqcls_model`` and
``seqcls_postprocess`` step classes of a version inside one python model, behind the ensemble's
inputs and outputs (``SEQCLS_SERVING_PIPELINE=direct`` publishes it as ``<m>``). To compare both
pipelines of *one* version on one server, this module loads the direct model of a version published
as an ensemble as a throwaway model with Triton's load-with-override API (config and files sent with
the request, nothing written into the repository, no route to it — as ``seqcls calibrate-layout``
loads its trials), so the bench can time the two side by side.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from seqcls.contract import shipped
from seqcls.contract.names import ServingNames
from seqcls.errors import InputError
from seqcls.serving.client import TritonOps, retrying
from seqcls.serving.repository import (
    DIRECT_STEPS,
    DIRECT_STEPS_FILE,
    RELEASE_FILE,
    SNAPSHOT,
    ServingOptions,
    direct_steps,
    parse_config,
    render_config,
)
from seqcls_tools.bench import lone

log = logging.getLogger(__name__)

#: The throwaway model's name suffix ('.' cannot start a role suffix: no seqcls model's names end like this).
SUFFIX = ".direct"
#: The empty python model's (:func:`floor_model`).
FLOOR_SUFFIX = ".floor"
SOURCE = Path(__file__).resolve().parents[3] / "model_repository" / "seqcls_direct" / "model.py"
#: An empty python model: each request's text comes back as its predictions. What one python stub hop
#: costs a lone request when the model does no work at all (gRPC, Triton, the stub's IPC, pb_utils).
FLOOR_SOURCE = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, {text!r}).as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor({out!r}, text)]))
        return responses
"""


def direct_model(repo: Path, names: ServingNames, version: int) -> tuple[str, str, dict[str, bytes]]:
    """``(name, config JSON, files)`` of the direct model for ``version`` of ``names``' release in ``repo``:
    the config publish renders for ``pipeline: direct`` with the version's serving options, and the
    files it would link in, read from the composing models' version directories."""
    from dataclasses import replace

    from google.protobuf import json_format

    info = json.loads((repo / names.model / str(version) / RELEASE_FILE).read_text(encoding="utf-8"))
    options = ServingOptions(**{**info["serving"], "buckets": tuple(info["serving"]["buckets"])})
    if options.runtime != "python-onnxruntime":
        raise InputError(
            f"{names.model} version {version} is served by Triton's {options.runtime!r} runtime; the direct "
            "pipeline runs the python-onnxruntime runtime's step (release with the python runtime to compare)"
        )
    options = replace(options, pipeline="direct")
    name = f"{names.ensemble}{SUFFIX}"
    text = render_config(SOURCE.parent.parent, names.ensemble, options, version=version, num_labels=0, names=names)
    config = parse_config(text, SNAPSHOT)
    config.name = name
    config.ClearField("version_policy")
    files: dict[str, bytes] = {"file:1/model.py": SOURCE.read_bytes()}
    snapshots = {}
    for role in DIRECT_STEPS:
        vdir = repo / getattr(names, role) / str(version)
        snapshots[getattr(names, role)] = (vdir / SNAPSHOT).read_text(encoding="utf-8")
        for path in sorted(vdir.iterdir()):
            if path.is_file() and path.stat().st_size:  # the empty __pycache__ guard cannot be sent
                files[f"file:1/{role}/{path.name}"] = path.read_bytes()
    files[f"file:1/{DIRECT_STEPS_FILE}"] = json.dumps(direct_steps(snapshots, names)).encode("utf-8")
    return name, json_format.MessageToJson(config), files


def floor_model(config_json: str, ensemble: str) -> tuple[str, str, dict[str, bytes]]:
    """``(name, config JSON, files)`` of an empty python model (:data:`FLOOR_SOURCE`) with the input, batch
    size, batching and instances of ``config_json`` (the direct model's, or the served ensemble's: one python
    instance, Triton's default batcher) and its ``predictions`` output only: the floor under any python model."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2 as mc

    c = shipped.contract()
    given = json_format.Parse(config_json, mc.ModelConfig(), ignore_unknown_fields=True)
    name = f"{ensemble}{FLOOR_SUFFIX}"
    floor = mc.ModelConfig(name=name, backend="python", max_batch_size=given.max_batch_size)
    floor.input.extend(given.input)
    floor.output.extend(o for o in given.output if o.name == c.PREDICTIONS_OUTPUT)
    floor.dynamic_batching.CopyFrom(given.dynamic_batching)  # an ensemble has none: the default batcher
    floor.instance_group.extend(
        given.instance_group or [mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)]
    )
    source = FLOOR_SOURCE.format(out=c.PREDICTIONS_OUTPUT, text=c.TEXT_INPUT)
    return name, json_format.MessageToJson(floor), {"file:1/model.py": source.encode("utf-8")}


def _load_model(op: TritonOps, model: tuple[str, str, dict[str, bytes]], what: str) -> str:
    name, config, files = model
    t0 = time.perf_counter()
    retrying(
        f"load {name!r} on {op.endpoint.grpc}",
        lambda: op.client.load_model(name, config=config, files=files, client_timeout=op.timeout),
    )
    log.info("bench: %s loaded (%s) in %.1fs", name, what, time.perf_counter() - t0)
    return name


def load_direct(op: TritonOps, model: tuple[str, str, dict[str, bytes]], version: int) -> str:
    """Load ``model`` (:func:`direct_model` of ``version``) on ``op``'s Triton (model control: the key); its name."""
    return _load_model(op, model, f"version {version}'s three steps in one python model")


def load_floor(op: TritonOps, config_json: str, ensemble: str) -> str:
    """Load :func:`floor_model` of ``config_json`` on ``op``'s Triton (model control: the key); its name."""
    return _load_model(op, floor_model(config_json, ensemble), "an empty python model with the same input")


def _answers(url: str, models: tuple[str, str], texts: list[str]) -> int:
    """How many of ``texts``, each sent alone, get different labels or probabilities from the two models."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=url)
    differing = 0
    try:
        for text in texts:
            data = np.array([[text.encode("utf-8")]], dtype=object)
            inp = grpcclient.InferInput("TEXT", list(data.shape), "BYTES")
            inp.set_data_from_numpy(data)
            a, b = (client.infer(m, [inp]) for m in models)
            same = np.array_equal(a.as_numpy("predictions"), b.as_numpy("predictions")) and np.array_equal(
                a.as_numpy("probabilities"), b.as_numpy("probabilities")
            )
            differing += not same
    finally:
        client.close()
    return differing


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def _perf_analyzer_lone(
    url: str, texts: list[str], models: dict[str, str], steps: dict[str, Any]
) -> dict[str, dict[str, float]]:
    """Per key of ``models``: perf_analyzer's lone p50, then right after it the same texts in process back to
    back (p50 of :func:`.lone.time_steps` totals): both sides warm and uninterrupted, unlike the Python
    client's interleaved blocks. {} when perf_analyzer is not installed (``make setup-perf``)."""
    import tempfile

    import numpy as np

    from seqcls_tools.bench import perf_analyzer

    binary = perf_analyzer.find_binary()
    if binary is None:
        log.info("bench: perf_analyzer is not installed (make setup-perf): lone requests by the Python client only")
        return {}
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="seqcls-pa-") as tmp:
        (data,) = perf_analyzer.input_data(texts, Path(tmp) / "lone.json")
        for key, model in models.items():
            p50 = perf_analyzer.lone_p50(binary, url, model, data, Path(tmp))
            if p50:
                inproc = [sum(lone.time_steps(steps, text)) for text in texts]
                out[key] = {"p50_ms": p50, "inprocess_p50_ms": round(float(np.percentile(inproc, 50)), 4)}
    return out


def _load(url: str, texts: list[str], models: dict[str, str], clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` concurrent single-text clients per model, ``seconds`` each in two alternating halves (the
    machine's other load drifts over both alike): sentences/s, p95, failures per key of ``models``."""
    from seqcls_tools.bench import measure

    totals: dict[str, dict[str, Any]] = {k: {"texts": 0, "seconds": 0.0, "failed": 0, "ms": []} for k in models}
    for _ in range(2):
        for key, model in models.items():
            r = measure.run_load(
                url,
                texts,
                clients=clients,
                texts_per_request=1,
                max_requests=10**9,
                max_seconds=seconds / 2,
                model=model,
            )
            totals[key]["texts"] += r.texts
            totals[key]["seconds"] += r.seconds
            totals[key]["failed"] += r.failed
            totals[key]["ms"] += r.latencies_ms
    return {
        key: {
            "clients": clients,
            "sentences_per_s": round(t["texts"] / t["seconds"], 1) if t["seconds"] else 0.0,
            "p95_ms": measure.percentiles(t["ms"])["p95_ms"],
            "failed": t["failed"],
        }
        for key, t in totals.items()
    }


def _summary(
    lone_results: dict[str, Any], load: dict[str, Any], pa_lone: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """The layouts (the keys of ``load``) and the floor (the other key of ``lone_results``) against one
    in-process reference: their interleaved in-process runs, averaged. ``pa_lone``: perf_analyzer's lone p50
    and the back-to-back in-process p50 beside it, per key (:func:`_perf_analyzer_lone`; absent: not measured)."""
    inproc_mean = sum(x["inprocess"]["mean_ms"] for x in lone_results.values()) / len(lone_results)
    inproc_p50 = sum(x["inprocess"]["p50_ms"] for x in lone_results.values()) / len(lone_results)
    limit = 1000.0 / inproc_mean
    out: dict[str, Any] = {
        "inprocess": {
            "p50_ms": round(inproc_p50, 4),
            "mean_ms": round(inproc_mean, 4),
            "limit_sentences_per_s": round(limit, 1),
        },
        "layouts": {},
    }
    for key, lone_result in lone_results.items():
        served = lone_result["served"]
        pa = pa_lone.get(key) or {}
        lone_out = {
            "p50_ms": served["client_p50_ms"],
            "mean_ms": served["client_mean_ms"],
            "inprocess_p50_ms": lone_result["inprocess"]["p50_ms"],  # this layout's own interleaved run
            "speed_vs_inprocess": _ratio(inproc_p50, served["client_p50_ms"]),
            "perf_analyzer_p50_ms": pa.get("p50_ms"),
            "perf_analyzer_inprocess_p50_ms": pa.get("inprocess_p50_ms"),
            "perf_analyzer_speed_vs_inprocess": _ratio(pa["inprocess_p50_ms"], pa["p50_ms"]) if pa else None,
            "parts": served["parts"],
        }
        if key not in load:  # the floor: no model work, so the best lone speed one stub hop allows
            ceiling = {"python": lone.ceiling(inproc_p50, served["client_p50_ms"])}
            if pa:
                ceiling["perf_analyzer"] = lone.ceiling(pa["inprocess_p50_ms"], pa["p50_ms"])
            out["floor"] = {**{k: v for k, v in lone_out.items() if "speed" not in k}, "ceiling": ceiling}
            continue
        out["layouts"][key] = {
            "lone": lone_out,
            "load": {**load[key], "speed_vs_inprocess": _ratio(load[key]["sentences_per_s"], limit)},
        }
    return out


def compare_layouts(
    server, release, options, texts: list[str], requests: int, *, clients: int = 8, seconds: float = 5.0
) -> dict[str, Any]:
    """The classic ensemble beside the direct model of the served version, on ``server``.

    Answers of every text alone (must not differ); ``requests`` lone requests to each and to the floor (an
    empty python model, :func:`floor_model`), every one in blocks alternating with the same work in process
    (:func:`seqcls_tools.bench.lone.served_and_in_process`), and a perf_analyzer run of each when it is
    installed; then ``clients`` concurrent single-text clients for ``seconds`` per layout (:func:`_load`).
    Speeds are served / in process (≥ 1: as fast as the in-process limit; :func:`_summary`); perf_analyzer's
    against the same texts in process right after it; the floor's ``ceiling`` is the lone speed a python model
    would reach if it cost nothing beyond its work and the empty model's hop."""
    from seqcls.serving.client import endpoints_from_settings
    from seqcls.serving.state import current_state
    from seqcls_tools.bench import measure
    from seqcls_tools.bench.serving import inprocess_steps, one_per_length

    names = release.config.model_name.names
    repo = Path(str(release.settings.triton_repository))
    version = current_state(repo, names.model_name).serving
    if version is None:
        raise InputError(f"{names.model_name!r} serves no version on {server.config.grpc_url}; serve a release first")
    op = TritonOps(endpoints_from_settings(release.settings)[0])
    url = server.config.grpc_url
    direct = direct_model(repo, names, version)  # reads every file of the version once: both loads send it
    name, floor = load_direct(op, direct, version), None
    try:
        floor = load_floor(op, direct[1], names.ensemble)
        differing = _answers(url, (names.ensemble, name), texts)
        log.info("bench: %d of %d texts answered differently by the ensemble and %s", differing, len(texts), name)
        warm = {"clients": clients, "texts_per_request": 1, "max_requests": 10**9}
        for model in (name, floor):  # warm-up: the stubs' first runs
            measure.run_load(url, texts, **warm, max_seconds=1.0, model=model)
        steps = inprocess_steps(release, options)
        # every text was just sent alone to both models; in process, one of each length runs untimed first
        every_length = one_per_length(texts, [len(x) for x in steps["tokenize"](list(texts))])
        models = {"ensemble": (names.ensemble, names.composing), "direct": (name, [name]), "floor": (floor, [floor])}
        lone_results = {
            key: lone.served_and_in_process(
                url, steps, texts, requests, ensemble=model, composing=composing, warm=every_length
            )
            for key, (model, composing) in models.items()
        }
        pa_lone = _perf_analyzer_lone(url, texts, {key: model for key, (model, _) in models.items()}, steps)
        load = _load(url, texts, {"ensemble": names.ensemble, "direct": name}, clients, seconds)
    finally:
        for model in (name, floor):
            if model is not None:
                op.unload(model)
    out = {"version": version, "model": name, "texts_compared": len(texts), "differing": differing}
    out.update(_summary(lone_results, load, pa_lone))
    d, e = out["layouts"]["direct"], out["layouts"]["ensemble"]
    log.info(
        "bench: direct vs ensemble — lone p50 %.2f vs %.2f ms (in process %.2f), %d clients %.1f vs %.1f sentences/s "
        "(in-process limit %.1f)",
        d["lone"]["p50_ms"],
        e["lone"]["p50_ms"],
        out["inprocess"]["p50_ms"],
        clients,
        d["load"]["sentences_per_s"],
        e["load"]["sentences_per_s"],
        out["inprocess"]["limit_sentences_per_s"],
    )
    f = out["floor"]
    log.info(
        "bench: an empty python model answers a lone request in %.2f ms (perf_analyzer: %s ms): with %.2f ms of work "
        "in process, no python model's lone speed exceeds %s",
        f["p50_ms"],
        f["perf_analyzer_p50_ms"],
        out["inprocess"]["p50_ms"],
        " / ".join(f"{v}× ({k})" for k, v in f["ceiling"].items()),
    )
    return out


__all__ = ["FLOOR_SUFFIX", "SUFFIX", "compare_layouts", "direct_model", "floor_model", "load_direct", "load_floor"]
