"""A lone request on a trained checkpoint, alone: the bench's lone-request section without the rest of the bench.

Releases the checkpoint (export → convert → validate) per profile, serves it on a fresh local Triton
with the default serving options, warms it up and runs :func:`seqcls_tools.bench.serving.lone_request`
on the demo set's test texts (``tools/seqcls_tools/demo/data/test.jsonl``): Triton's statistics per
composing model beside the same work in process. Then (unless ``--no-direct``) the same version in
the direct layout (:mod:`.direct`: the three steps in one python model) beside the ensemble: answers,
lone requests and ``--clients`` concurrent clients, each against the in-process limit. Prints the
sections as ``seqcls bench`` writes them (conditions line included), then the JSON. ::

    .venv/bin/python -m seqcls_tools.bench.lone_cli --checkpoint DIR [--profiles fp32,int8] [--requests 300]

Without ``--checkpoint`` the quick demo model is trained first (~40 s on two cores).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from seqcls.serving.repository import ServingOptions
from seqcls_tools.bench import conditions, machine
from seqcls_tools.bench.direct import compare_layouts
from seqcls_tools.bench.markdown import direct_section, lone_section
from seqcls_tools.bench.plan import FULL
from seqcls_tools.bench.profiles import bench_release, bench_settings, serve_release
from seqcls_tools.bench.serving import BenchServer, lone_request, one_per_length, warm_up
from seqcls_tools.bench.tokens import token_distribution

log = logging.getLogger("seqcls_tools.bench")
DEMO_DATA = Path(__file__).resolve().parents[1] / "demo" / "data"


def run(
    checkpoint: Path,
    profiles: list[str],
    requests: int,
    work: Path,
    *,
    direct: bool = True,
    clients: int = 8,
    seconds: float = 10.0,
) -> dict[str, Any]:
    """The lone-request results of ``checkpoint`` per profile, shaped like ``seqcls bench``'s results;
    with ``direct``, also the direct layout beside the ensemble (:func:`.direct.compare_layouts`)."""
    from seqcls.contract import shipped
    from seqcls.release.records import serving_tokenizer
    from seqcls.steps import run_release

    texts = [json.loads(line)["text"] for line in (DEMO_DATA / "test.jsonl").read_text(encoding="utf-8").splitlines()]
    options = ServingOptions()
    home = work / "home"
    results: dict[str, Any] = {
        "meta": {"machine": machine.machine_facts(), "loadavg_start": machine.loadavg(), "budget": {}},
        "configs": {},
    }
    results["meta"]["budget"]["lone_requests"] = requests
    for i, profile in enumerate(profiles):
        run_release(bench_release(checkpoint, profile, bench_settings(home)), until="evaluate")
        with BenchServer(work, i, keep=False) as server:
            release = bench_release(checkpoint, profile, bench_settings(home, server))
            serve_release(release, options)
            tok = serving_tokenizer(release).build(shipped.text(), release.config.max_length)
            lengths = [len(x) for x in shipped.text().encode(tok, texts)]
            if "corpus" not in results:
                results["corpus"] = {"tokens": token_distribution(lengths), "source": "demo test.jsonl"}
            warm_up(server, texts, FULL, one_per_length(texts, lengths))
            results["configs"][profile] = {
                "profile": profile,
                "options": options.to_dict(),
                "lone": lone_request(server, release, options, texts, requests),
            }
            if direct:
                results["configs"][profile]["direct"] = compare_layouts(
                    server, release, options, texts, requests, clients=clients, seconds=seconds
                )
    results["meta"]["loadavg_end"] = machine.loadavg()
    results["conditions"] = {"lone": conditions.sections(results)["lone"]}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="a trained checkpoint (default: train the quick demo model)")
    parser.add_argument(
        "--profiles",
        default="fp32",
        help="comma-separated: fp32, fp32-fused, int8, bf16 (on a CPU with bf16 arithmetic)",
    )
    parser.add_argument("--requests", type=int, default=300, help="sequential single-text requests per profile")
    parser.add_argument("--no-direct", action="store_true", help="skip the direct layout beside the ensemble")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients of the layouts' load run")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of load per layout")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with tempfile.TemporaryDirectory(prefix="seqcls-lone-") as tmp:
        from seqcls_tools.demo.train import checkpoint_or_quick_demo

        checkpoint = checkpoint_or_quick_demo(args.checkpoint, Path(tmp))
        results = run(
            checkpoint,
            args.profiles.split(","),
            args.requests,
            Path(tmp) / "work",
            direct=not args.no_direct,
            clients=args.clients,
            seconds=args.seconds,
        )
    print("\n".join(lone_section(results) + direct_section(results)))
    print(json.dumps(results, ensure_ascii=False, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
