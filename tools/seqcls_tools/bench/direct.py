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

log = logging.getLogger(__name__)

#: The throwaway model's name suffix ('.' cannot start a role suffix: no seqcls model's names end like this).
SUFFIX = ".direct"
SOURCE = Path(__file__).resolve().parents[3] / "model_repository" / "seqcls_direct" / "model.py"


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


def load_direct(op: TritonOps, repo: Path, names: ServingNames, version: int) -> str:
    """Load the direct model for ``version`` on ``op``'s Triton (model control: the key); its name."""
    name, config, files = direct_model(repo, names, version)
    t0 = time.perf_counter()
    retrying(
        f"load {name!r} on {op.endpoint.grpc}",
        lambda: op.client.load_model(name, config=config, files=files, client_timeout=op.timeout),
    )
    log.info(
        "bench: %s loaded (version %d's three steps in one python model) in %.1fs",
        name,
        version,
        time.perf_counter() - t0,
    )
    return name


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


def _summary(lone_results: dict[str, Any], load: dict[str, Any]) -> dict[str, Any]:
    """Both layouts against one in-process reference: their two interleaved in-process runs, averaged."""
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
        out["layouts"][key] = {
            "lone": {
                "p50_ms": served["client_p50_ms"],
                "mean_ms": served["client_mean_ms"],
                "inprocess_p50_ms": lone_result["inprocess"]["p50_ms"],  # this layout's own interleaved run
                "speed_vs_inprocess": _ratio(inproc_p50, served["client_p50_ms"]),
                "parts": served["parts"],
            },
            "load": {**load[key], "speed_vs_inprocess": _ratio(load[key]["sentences_per_s"], limit)},
        }
    return out


def compare_layouts(
    server, release, options, texts: list[str], requests: int, *, clients: int = 8, seconds: float = 5.0
) -> dict[str, Any]:
    """The classic ensemble beside the direct model of the served version, on ``server``.

    Answers of every text alone (must not differ); ``requests`` lone requests to each, every one in
    blocks alternating with the same work in process (:func:`seqcls_tools.bench.lone.served_and_in_process`);
    then ``clients`` concurrent single-text clients for ``seconds`` per layout (:func:`_load`). Speeds are
    served / in process (≥ 1: as fast as the in-process limit; :func:`_summary`)."""
    from seqcls.serving.client import endpoints_from_settings
    from seqcls.serving.state import current_state
    from seqcls_tools.bench import lone, measure
    from seqcls_tools.bench.serving import inprocess_steps, one_per_length

    names = release.config.model_name.names
    repo = Path(str(release.settings.triton_repository))
    version = current_state(repo, names.model_name).serving
    if version is None:
        raise InputError(f"{names.model_name!r} serves no version on {server.config.grpc_url}; serve a release first")
    op = TritonOps(endpoints_from_settings(release.settings)[0])
    url = server.config.grpc_url
    name = load_direct(op, repo, names, version)
    try:
        differing = _answers(url, (names.ensemble, name), texts)
        log.info("bench: %d of %d texts answered differently by the ensemble and %s", differing, len(texts), name)
        warm = {"clients": clients, "texts_per_request": 1, "max_requests": 10**9}
        measure.run_load(url, texts, **warm, max_seconds=1.0, model=name)  # warm-up: the stub's first runs
        steps = inprocess_steps(release, options)
        # every text was just sent alone to both models; in process, one of each length runs untimed first
        every_length = one_per_length(texts, [len(x) for x in steps["tokenize"](list(texts))])
        lone_results = {
            "ensemble": lone.served_and_in_process(
                url, steps, texts, requests, ensemble=names.ensemble, composing=names.composing, warm=every_length
            ),
            "direct": lone.served_and_in_process(
                url, steps, texts, requests, ensemble=name, composing=[name], warm=every_length
            ),
        }
        load = _load(url, texts, {"ensemble": names.ensemble, "direct": name}, clients, seconds)
    finally:
        op.unload(name)
    out = {"version": version, "model": name, "texts_compared": len(texts), "differing": differing}
    out.update(_summary(lone_results, load))
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
    return out


__all__ = ["SUFFIX", "compare_layouts", "direct_model", "load_direct"]
