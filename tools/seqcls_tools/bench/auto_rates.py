"""``profile: auto``'s timing run on the bench's own releases, so its recorded rates can be held to the bench's.

``auto`` chooses a profile from rates it measures in process (:mod:`seqcls.profiles.timing`); a choice is
only as good as those rates are true to what is served. So the bench times every profile it released the
way ``auto`` does (:func:`seqcls.profiles.auto.time_requests`: the same sessions, every length warmed,
steady passes, then the expected concurrency) on the texts its in-process limit runs, and the ratios hold
auto's single-text rate to the bench's in-process limit of the same profile (within 10 %), with auto's rate
at 8 clients beside the served 8-client figure.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from seqcls.errors import SeqclsError
from seqcls_tools.bench.profiles import bench_release, bench_settings

log = logging.getLogger("seqcls_tools.bench")
#: Texts auto times at most (:data:`seqcls.profiles.auto.MAX_TEXTS`), here the corpus's first ones: the
#: in-process limit starts at the corpus's first text too.
TEXTS = 200


def auto_rates(
    checkpoint: Path, home: Path, texts: list[str], releases: dict[str, Any], clients: int
) -> dict[str, Any]:
    """Per released profile whose gate passed: auto's single-text rate, its rate at ``clients``, both curves."""
    from seqcls.profiles.auto import MAX_TEXTS, time_requests
    from seqcls.release.records import served_onnx
    from seqcls.steps.convert import answering

    profiles = [p for p, r in releases.items() if r.get("gate_passed")]
    if not profiles:
        return {}
    graphs, how = {}, None
    for profile in profiles:
        release = bench_release(checkpoint, profile, bench_settings(home))
        graphs[profile] = served_onnx(release.workspace)
        how = how or answering(release)
    timed = texts[: min(TEXTS, MAX_TEXTS)]
    try:
        timings, _, threads = time_requests(graphs, timed, how, clients)
    except SeqclsError as exc:  # a broken engine is the releases' finding, not a reason to lose the run
        log.error("bench: auto's timing failed: %s", exc)
        return {"error": str(exc)[:400]}
    out: dict[str, Any] = {"texts": len(timed), "clients": clients, "threads": threads, "profiles": {}}
    for profile, t in timings.items():
        out["profiles"][profile] = {"single_sentences_per_s": round(t.single or 0.0, 2), **t.evidence()}
    log.info(
        "bench: auto's timing — %s",
        ", ".join(
            f"{p}: {e['single_sentences_per_s']}/s alone, {e['concurrent_sentences_per_s']}/s at {clients}"
            for p, e in out["profiles"].items()
        ),
    )
    return out


__all__ = ["auto_rates"]
