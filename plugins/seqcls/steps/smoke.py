"""Step 7 — smoke: the candidate must answer what the parity gate validated, before anyone sees it.

Over gRPC on every endpoint, through the model's candidate route (``<m>_candidate``, for the
default model ``seqcls_candidate``) pinned to version N (unpinned clients of the ensemble ``<m>``
never reach it), or through ``<m>`` pinned to N when N is already the served version (a re-run):
metadata has the
contract's inputs/outputs; every golden text, sent alone and in batched requests, gets exactly
the label set recorded in ``parity/expected.json`` (only near-threshold texts may differ) and
probabilities within tolerance. A profile gated on decision agreement (int8) is held to the same
agreement here. Latency percentiles are reported. A failure names the texts.

Then the shadow comparison (when the quality gate ran on an eval set): a sample of its texts
(``quality/shadow.json``) goes through the candidate route and the public route of the first
endpoint — the live champion and the live candidate side by side on the real server — and how often
their label sets differ is reported (``shadow`` in the summary), with how often the live candidate
differs from what the quality gate scored offline. Reported, not gated: the quality gate judged the
candidate on the whole labeled set; this shows what changes for traffic on the server itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.contract import shipped
from seqcls.contract.names import ENSEMBLE
from seqcls.errors import SmokeError, StepOrderError
from seqcls.release.records import OUT_DIRS, Expected, ExpectedItem, Shadow, published_version
from seqcls.release.workspace import Release, StepResult
from seqcls.serving import metrics
from seqcls.serving.client import Endpoint, TritonOps, endpoints_from_settings
from seqcls.serving.state import current_state
from seqcls.steps import require

log = logging.getLogger(__name__)

STEP = "smoke"
OUT_DIR = OUT_DIRS[STEP]
BATCH = 8


def infer(client, texts: Sequence[str], *, model: str = ENSEMBLE, version: int | None = None):
    """One request through the one client; ``client`` may also be a raw tritonclient gRPC client."""
    ops = client if isinstance(client, TritonOps) else TritonOps.wrap(client)
    return ops.infer(texts, model=model, version=version)


def _check_metadata(client: TritonOps, version: int, route: str) -> list[str]:
    meta = client.metadata(route, version)
    c = shipped.contract()
    problems = []
    inputs = {i["name"]: i["datatype"] for i in meta.get("inputs", [])}
    outputs = {o["name"]: o["datatype"] for o in meta.get("outputs", [])}
    if inputs != {c.TEXT_INPUT: "BYTES"}:
        problems.append(f"inputs {inputs}, expected {{{c.TEXT_INPUT!r}: 'BYTES'}}")
    want = {c.PREDICTIONS_OUTPUT: "BYTES", c.PROBABILITIES_OUTPUT: "FP32"}
    if outputs != want:
        problems.append(f"outputs {outputs}, expected {want}")
    if str(version) not in meta.get("versions", [str(version)]):
        problems.append(f"versions {meta.get('versions')} lack {version}")
    return problems


def compare(
    items: Sequence[ExpectedItem], preds: list[list[dict]], probs: np.ndarray, prob_atol: float, mode: str
) -> list[dict[str, Any]]:
    """Differences between served answers and expected ones (near-threshold flips allowed)."""
    diffs = []
    for i, (item, pred) in enumerate(zip(items, preds, strict=True)):
        got = sorted(p["label"] for p in pred)
        want = sorted(item.labels)
        pdiff = float(np.abs(np.asarray(item.probabilities, dtype=np.float32) - probs[i]).max(initial=0))
        if (got != want and not item.near_threshold) or pdiff > prob_atol:
            diffs.append(
                {
                    "index": i,
                    "text": item.text[:80],
                    "mode": mode,
                    "expected": want,
                    "served": got,
                    "prob_max_abs_diff": pdiff,
                }
            )
    return diffs


def _triton_counts(endpoint: Endpoint, route: str, version: int) -> dict[str, float] | None:
    """The route version's request counters from the endpoint's metrics port (None: not configured/down)."""
    if not endpoint.metrics:
        return None
    try:
        return metrics.counts(metrics.scrape(endpoint.metrics), route, version)
    except Exception as exc:  # evidence only: a metrics port that is down never fails a smoke test
        log.warning("smoke: no metrics from %s (%s)", endpoint.metrics, exc)
        return None


def _settled_counts(
    endpoint: Endpoint, route: str, version: int, before: dict[str, float], sent: int, timeout: float = 2.0
) -> dict[str, float] | None:
    """The counters once Triton has counted every request sent: it updates them after the response
    is on its way, so a scrape right after the last answer can miss that request (seen: 73 of 74)."""
    deadline = time.monotonic() + timeout
    while True:
        after = _triton_counts(endpoint, route, version)
        done = after is None or sum(metrics.delta(before, after)[k] for k in metrics.COUNTERS[:2]) >= sent
        if done or time.monotonic() > deadline:
            return after
        time.sleep(0.05)


def smoke_endpoint(endpoint: Endpoint, version: int, expected: Expected, route: str) -> dict[str, Any]:
    client = TritonOps(endpoint)
    counted = _triton_counts(endpoint, route, version)
    items = expected.items
    texts = [it.text for it in items]
    tol = float(expected.prob_atol)
    problems = _check_metadata(client, version, route)
    latencies, diffs = [], []
    single_preds, single_probs = [], []
    for text in texts:
        t0 = time.perf_counter()
        p, pr = infer(client, [text], model=route, version=version)
        latencies.append((time.perf_counter() - t0) * 1000)
        single_preds += p
        single_probs.append(pr[0])
    diffs += compare(items, single_preds, np.stack(single_probs), tol, "single")
    batch_preds, batch_probs = [], []
    for start in range(0, len(texts), BATCH):
        p, pr = infer(client, texts[start : start + BATCH], model=route, version=version)
        batch_preds += p
        batch_probs.append(pr)
    diffs += compare(items, batch_preds, np.concatenate(batch_probs), tol, f"batch of {BATCH}")
    lat = np.asarray(latencies)
    sent = len(texts) + -(-len(texts) // BATCH)
    after = _settled_counts(endpoint, route, version, counted, sent) if counted is not None else None
    agreement = None
    if expected.gate == "agreement":
        # A quantised profile was gated on decision agreement, not exactness: same rule here.
        decisions = 2 * len(items) * len(expected.labels)
        changed = sum(len(set(d["expected"]) ^ set(d["served"])) for d in diffs)
        agreement = 1.0 - changed / max(decisions, 1)
        passed = not problems and agreement >= float(expected.min_agreement)
    else:
        passed = not problems and not diffs
    return {
        "endpoint": endpoint.grpc,
        "texts": len(texts),
        "metadata_problems": problems,
        "differences": diffs,
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p95_ms": round(float(np.percentile(lat, 95)), 2),
        "agreement": agreement,
        "passed": passed,
        "requests_sent": sent,
        # Triton's own count of this route version's requests during the smoke test (metrics port)
        "triton_metrics": metrics.delta(counted, after) if counted is not None and after is not None else None,
    }


def _answers(client: TritonOps, texts: Sequence[str], route: str, version: int | None) -> list[set[str]]:
    out: list[set[str]] = []
    for start in range(0, len(texts), BATCH):
        preds, _ = infer(client, texts[start : start + BATCH], model=route, version=version)
        out += [{p["label"] for p in row} for row in preds]
    return out


def shadow_compare(endpoint: Endpoint, sample: Shadow, route: str, version: int, public: str) -> dict[str, Any]:
    """The sample through the candidate route and the public one: how often the live answers differ."""
    client = TritonOps(endpoint)
    t0 = time.perf_counter()
    cand = _answers(client, sample.texts, route, version)
    offline = sum(c != set(o) for c, o in zip(cand, sample.candidate, strict=True))
    report: dict[str, Any] = {"endpoint": endpoint.grpc, "texts": len(sample.texts), "offline_mismatch": offline}
    if route != public and sample.champion_version is not None:  # else nothing served beside it
        served = _answers(client, sample.texts, public, None)
        report["disagree"] = sum(a != b for a, b in zip(cand, served, strict=True))
        report["disagreement_rate"] = round(report["disagree"] / max(len(cand), 1), 4)
        report["champion_version"] = sample.champion_version
    report["seconds"] = round(time.perf_counter() - t0, 3)
    log.info(
        "smoke: shadow — %d eval texts through %s v%d%s: %s; live candidate vs offline score: %d differ",
        len(sample.texts),
        route,
        version,
        f" and {public} (serving v{sample.champion_version})" if "disagree" in report else "",
        f"champion and candidate disagree on {report['disagree']} ({report['disagreement_rate']:.1%})"
        if "disagree" in report
        else "no champion beside it",
        offline,
    )
    return report


def shadow_of(release: Release, endpoint: Endpoint, route: str, version: int) -> dict[str, Any] | None:
    """The shadow comparison when the quality gate left a sample (None: no eval set, or it could not be made)."""
    sample = Shadow.find(release.workspace)
    if sample is None or not sample.texts:
        return None
    try:
        return shadow_compare(endpoint, sample, route, version, release.config.model_name.names.ensemble)
    except Exception as exc:  # evidence only: the golden texts are the gate
        log.warning("smoke: shadow comparison not made (%s: %s)", type(exc).__name__, exc)
        return None


def smoke_route(release: Release, version: int) -> str:
    """Where version N answers: the candidate route while in flight, the public ensemble once served."""
    state = current_state(Path(str(release.settings.triton_repository)), release.config.model_name)
    names = release.config.model_name.names
    if state.candidate == version:
        return names.candidate
    if state.serving == version:
        return names.ensemble
    raise StepOrderError(
        f"version {version} of {release.config.model_name!r} is neither the candidate nor served (recorded state: "
        f"serving {state.serving}, candidate {state.candidate}); run `seqcls reload` first."
    )


def smoke(release: Release, endpoints: Sequence[Endpoint] | None = None) -> StepResult:
    """Assert version N answers the validated decisions on every endpoint, before it is exposed."""
    ws = release.workspace
    require(release, STEP)
    version = published_version(release)
    endpoints = list(endpoints or endpoints_from_settings(release.settings))
    expected = Expected.load(ws)
    route = smoke_route(release, version)
    inputs = {"version": version, "endpoints": [e.grpc for e in endpoints], "route": route}

    def body(out: Path) -> tuple[dict, str]:
        reports = []
        for ep in endpoints:
            log.info(
                "smoke: %d golden texts → %s version %d on %s (single, then batches of %d)",
                len(expected.items),
                route,
                version,
                ep.grpc,
                BATCH,
            )
            try:
                reports.append(smoke_endpoint(ep, version, expected, route))
            except Exception as exc:  # transport or server error: a failed smoke, with the server's words
                reports.append({"endpoint": ep.grpc, "passed": False, "error": f"{type(exc).__name__}: {exc}"})
            r = reports[-1]
            log.info(
                "smoke: %s — %s%s",
                ep.grpc,
                "passed" if r["passed"] else "FAILED",
                f", p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms" if "p50_ms" in r else "",
            )
        (out / "smoke.json").write_text(json.dumps(reports, indent=1, ensure_ascii=False), encoding="utf-8")
        failed = [r for r in reports if not r["passed"]]
        if failed:
            parts = []
            for r in failed:
                if r.get("error"):
                    parts.append(f"{r['endpoint']}: {r['error']}")
                    continue
                d = r["differences"]
                first = "; ".join(
                    f"#{x['index']} {x['text']!r} ({x['mode']}): expected {x['expected']}, served "
                    f"{x['served']}, max |Δp| {x['prob_max_abs_diff']:.2g}"
                    for x in d[:3]
                )
                parts.append(
                    f"{r['endpoint']}: {len(d)} answers differ{' — ' + first if first else ''}"
                    + (f"; metadata: {r['metadata_problems']}" if r["metadata_problems"] else "")
                )
            model = release.config.model_name
            raise SmokeError(f"smoke test of {model} Triton v{version} failed: " + " | ".join(parts))
        shadow = shadow_of(release, endpoints[0], route, version)
        summary = {
            "version": version,
            "shadow": shadow,
            "endpoints": [r["endpoint"] for r in reports],
            "texts": reports[0]["texts"],
            "p50_ms": max(r["p50_ms"] for r in reports),
            "p95_ms": max(r["p95_ms"] for r in reports),
            "route": route,
            "triton_metrics": {r["endpoint"]: r.get("triton_metrics") for r in reports},
        }
        shadowed = (
            f"; shadow: champion and candidate disagree on {shadow['disagree']} of {shadow['texts']} eval texts"
            if shadow and "disagree" in shadow
            else ""
        )
        return summary, (
            f"{summary['texts']} golden texts answered as validated on {len(reports)} endpoint(s), "
            f"single + batched; p50 {summary['p50_ms']} ms, p95 {summary['p95_ms']} ms{shadowed}"
        )

    return ws.run_step(STEP, inputs, body, out_dir=OUT_DIR, always_run=True)
