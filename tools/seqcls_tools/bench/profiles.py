"""The benchmark's releases: one per profile through the release core, and how their answers depend on batching.

Also the bridge to serving: :func:`serve_release` runs the step table's serving steps on a release.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from seqcls.errors import GateError
from seqcls.serving.repository import ServingOptions
from seqcls_tools.bench import measure
from seqcls_tools.bench.facts import convert_facts, gate_facts, parity_report
from seqcls_tools.bench.plan import PROFILES

log = logging.getLogger("seqcls_tools.bench")


def bench_settings(home: Path, server=None):
    from seqcls.settings import Settings

    if server is None:
        return Settings(home=home)
    cfg = server.config
    return Settings(
        home=home,
        triton_repository=cfg.repository,
        triton_grpc=(cfg.grpc_url,),
        triton_http=(cfg.http_url,),
    )


def bench_release(checkpoint: Path, profile: str, settings):
    """The bench's release of ``profile``: every profile under the default model name, so a hot
    reload swaps versions of the one ensemble clients call (``seqcls``); a workspace per profile
    (its own home under the bench's), so each profile's records survive the others."""
    from dataclasses import replace

    from seqcls.config import ReleaseConfig
    from seqcls.release.intake import open_release

    settings = replace(settings, home=Path(settings.home) / f"profile-{profile}")
    return open_release(checkpoint, ReleaseConfig(profile=profile), settings)


def run_releases(checkpoint: Path, home: Path, profiles: tuple[str, ...] = PROFILES) -> dict[str, Any]:
    from seqcls.steps import run_release

    out: dict[str, Any] = {}
    for profile in profiles:
        release = bench_release(checkpoint, profile, bench_settings(home))
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"profile": profile, "steps": {}}
        try:
            for result in run_release(release, until="evaluate"):
                entry["steps"][result.step] = round(result.seconds, 2)
            entry["gate_passed"] = True
        except GateError as exc:
            entry["gate_passed"] = False
            entry["gate_error"] = str(exc)[:600]
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        entry["convert"] = convert_facts(release.workspace)
        report = parity_report(release.workspace)
        if report is not None:
            entry["gate"] = gate_facts(report)
        out[profile] = entry
        log.info(
            "bench: release %s — %s in %.0fs (%s)",
            profile,
            "gate passed" if entry["gate_passed"] else "GATE FAILED",
            entry["seconds"],
            ", ".join(f"{k} {v}s" for k, v in entry["steps"].items()),
        )
    return out


def batch_dependence(
    checkpoint: Path, home: Path, texts: list[str], batch: int = 16, profiles: tuple[str, ...] = PROFILES
) -> dict[str, Any]:
    """Does a text's answer depend on what it is batched with? Each profile's served model on the
    golden texts, each text alone vs in padded batches of ``batch`` (how validate runs them), and how
    it is served (:func:`served_batching`: for bf16 the parity gate's batch-invariance verdict),
    tokenized by the release's serving tokenizer and fed the inputs the session declares (the
    shipped ``seqcls_text.model_feeds``, as Triton's model feeds them).

    fp32 models differ only by float rounding. ``int8`` is dynamic INT8 of the encoder's MatMuls
    and fused Attention (the embeddings and the classification head stay fp32; convert checks it
    on the golden texts and falls back to a recipe with more fp32 when decisions move): the
    quantization range of each activation is computed at run time over the whole batch, so
    neighbours (and their padding) move the logits. ``bf16`` answers each text in its bucket shape,
    so padding to a batch's longest does not move it, and batches only where the gate proved it.
    """
    import numpy as np

    from seqcls.contract import shipped
    from seqcls.release.records import effective_profile, served_onnx, serving_tokenizer

    text_mod, decide_mod = shipped.text(), shipped.decide()
    out: dict[str, Any] = {}
    for profile in profiles:
        release = bench_release(checkpoint, profile, bench_settings(home))
        model = served_onnx(release.workspace)
        if not model.is_file():
            continue
        (session,) = measure.ort_sessions(
            model, workers=1, intra_op_threads=1, graph_level="all", profile=effective_profile(release)
        )
        serving = serving_tokenizer(release)
        max_length = release.config.max_length
        ids = text_mod.encode(serving.build(text_mod, max_length), texts)
        names = [i.name for i in session.get_inputs()]

        def run(rows, session=session, names=names, pad_id=serving.pad_id, max_length=max_length):
            feeds = text_mod.model_feeds(rows, names, max_length=max_length, pad_id=pad_id)
            return session.run(["logits"], feeds)[0]

        alone = np.concatenate([run([x]) for x in ids])
        batched = np.concatenate([run(ids[i : i + batch]) for i in range(0, len(ids), batch)])
        p1, p2 = decide_mod.sigmoid(alone), decide_mod.sigmoid(batched)
        labels = list(release.checkpoint.labels)
        th = decide_mod.threshold_vector(labels, release.config.threshold)
        d1 = decide_mod.decide(p1, th, labels, hierarchy=release.config.hierarchy)
        d2 = decide_mod.decide(p2, th, labels, hierarchy=release.config.hierarchy)
        changed = sum(1 for a, b in zip(d1, d2, strict=True) if [x[0] for x in a] != [x[0] for x in b])
        report = parity_report(release.workspace)
        out[profile] = {
            "texts": len(texts),
            "batch": batch,
            "prob_max_abs_diff": float(np.abs(p1 - p2).max(initial=0.0)),
            "label_sets_changed": changed,
            "served": served_batching(profile, report.batch_invariance if report is not None else {}),
        }
    log.info(
        "bench: alone vs batched — %s",
        ", ".join(
            f"{k}: {v['label_sets_changed']} label sets, max |Δp| {v['prob_max_abs_diff']:.2g}" for k, v in out.items()
        ),
    )
    return out


def served_batching(profile: str, invariance: dict[str, Any]) -> str:
    """How the served model batches ``profile``'s texts: for an engine that may batch (bf16), the parity
    gate's batch-invariance criterion (its verdict and evidence); otherwise what the profile is."""
    from seqcls.spec import EXACT_PROFILES

    if invariance:
        figures = (
            f"{invariance.get('rows_differing')}/{invariance.get('rows_compared')} rows moved in "
            f"{invariance.get('compositions')} random compositions"
        )
        if invariance.get("serving") == "batched":
            return f"batched in bucket shapes, parity gate: {figures}"
        return f"alone, parity gate: {figures}; {invariance.get('why')}"
    if profile in EXACT_PROFILES:
        return "equal lengths share a run (exact profile)"
    return "alone (answers move with batch-mates)"


def serving_steps() -> tuple[str, ...]:
    """The step table's steps that take a validated release to serving: publish up to promote
    (publish, reload, smoke, expose today); register and promote need MLflow, which the bench skips."""
    from seqcls.steps import ORDER

    return ORDER[ORDER.index("publish") : ORDER.index("promote")]


def serve_release(release, options: ServingOptions, results: dict | None = None) -> dict[str, Any]:
    """Run :func:`serving_steps` on ``release`` with the bench's serving options; step name → result.

    ``results`` (if given) is filled as the steps finish, so a caller still has them when one fails.
    """
    import inspect

    from seqcls.release import control
    from seqcls.steps import step

    results = {} if results is None else results
    try:
        for name in serving_steps():
            fn = step(name).load()
            kwargs = {"options": options} if "options" in inspect.signature(fn).parameters else {}
            results[name] = fn(release, **kwargs)
    finally:  # serving steps alone never reach promote, which ends a release's lease: end it here
        repository = Path(str(release.settings.triton_repository))
        control.give_lease(repository, release.config.model_name, control.release_owner(release))
    return results
