"""Which INT8 recipe passes the ``int8`` gate with margin, and how fast is it? (issue 16)

For each seed the bench's model (``--spec medium``: the ERNIE-3.0-medium shape of
:mod:`.model`, corpus and 64 golden texts as the full bench builds them) goes through the
release core up to ``convert`` (profile ``fp32``), is fused once (``fp32-fused``) and quantized
with every candidate :class:`~seqcls.profiles.quantize.Int8Recipe` — the static ones calibrated on the
golden texts, tokenized by the serving tokenizer, as ``convert`` does. Each candidate is scored
as the gate scores it (Paddle Inference on the static model vs ONNX Runtime on the candidate,
golden texts in batches of 16, :func:`seqcls.gates.parity.decision_report`): decision agreement,
changed label sets, max |Δprob|; and on ``--held-out`` other corpus texts (never calibrated on).
Speed: in-process sentences/s (serving tokenizer → pad → ORT, one thread) of fp32, fp32-fused
and each candidate, single texts and batches of 8, rounds interleaved, on the first seed.
``--gate`` finally runs the real release (export → convert → validate, profile ``int8``) per
seed and reports the gate's own figures. ``--demo DIR`` adds a trained demo checkpoint
(``python -m seqcls_tools.demo.train DIR``, ~2 min). About 25 minutes on 2 cores for all of it:

    .venv/bin/python -m seqcls_tools.demo.train /tmp/seqcls-int8-study/demo/checkpoint
    .venv/bin/python -m seqcls_tools.bench.int8_study --seeds 0 1 2 --demo /tmp/seqcls-int8-study/demo/checkpoint --gate

Checkpoints and workspaces are kept in ``--work`` (default ``/tmp/seqcls-int8-study``) and
reused by the next run; results go to ``<work>/int8_study.json`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.profiles.calibration import Calibration
from seqcls.profiles.checks import graph_inputs
from seqcls.profiles.quantize import INT8, INT8_V1, Int8Recipe, quantize_int8

log = logging.getLogger("seqcls_tools.bench.int8_study")

#: The candidates (the current profile :data:`~seqcls.profiles.quantize.INT8` is added if not among them).
CANDIDATES: tuple[Int8Recipe, ...] = (
    INT8_V1,
    Int8Recipe("dynamic", op_types=("MatMul", "Attention")),
    Int8Recipe("dynamic-matmul", op_types=("MatMul",)),
    Int8Recipe("dynamic-ffn_out-fp32", op_types=("MatMul", "Attention"), fp32=("head", "ffn_out")),
    Int8Recipe("dynamic-last-fp32", op_types=("MatMul", "Attention"), fp32=("head", "last_block")),
    Int8Recipe("static-qdq", method="static-qdq", op_types=("MatMul",)),
    Int8Recipe("static-qop", method="static-qoperator", op_types=("MatMul",)),
)


def _settings(home: Path):
    from seqcls.settings import Settings

    return Settings(home=home)


def bench_checkpoint(work: Path, spec, seed: int, corpus_size: int, golden: int) -> tuple[Path, list[str]]:
    """The bench's checkpoint for ``seed`` (built once, reused); returns it and the corpus."""
    from seqcls_tools.bench.corpus import make_corpus, make_labels
    from seqcls_tools.bench.model import build_checkpoint

    corpus = make_corpus(corpus_size, seed=seed)
    path = work / f"{spec.name}-seed{seed}" / "checkpoint"
    if not (path / "bench_model.json").is_file():
        build_checkpoint(path, spec, corpus, make_labels(spec.num_labels), golden=corpus[-golden:], seed=seed)
    return path, corpus


def release_for(checkpoint: Path, profile: str, home: Path):
    from seqcls.config import ReleaseConfig
    from seqcls.workspace import open_release

    return open_release(checkpoint, ReleaseConfig(profile=profile), _settings(home / f"profile-{profile}"))


class Scorer:
    """The gate's comparison for one checkpoint: Paddle Inference logits once, candidates against them."""

    def __init__(self, release, texts: list[str]):
        from seqcls.gates import parity
        from seqcls.records import static_dir
        from seqcls.serving import shipped
        from seqcls.steps.validate import serving_ids

        self.release, self.texts = release, texts
        self.decide = shipped.decide()
        cfg, ckpt = release.config, release.checkpoint
        self.labels = list(ckpt.labels)
        self.thresholds = self.decide.threshold_vector(self.labels, cfg.threshold, cfg.thresholds)
        self.ids = serving_ids(release, texts)
        self.p_ref = self.decide.sigmoid(parity.paddle_logits(static_dir(release.workspace), self.ids))

    def score(self, model: Path) -> dict[str, Any]:
        from seqcls.gates import parity
        from seqcls.profiles.checks import feeds_for
        from seqcls.serving import shipped

        text_mod = shipped.text()
        session = parity.ort_session(model, ["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        out = []
        for start in range(0, len(self.ids), parity.BATCH):  # validate's batches, padded to the longest
            rows = self.ids[start : start + parity.BATCH]
            input_ids, _ = text_mod.pad(rows)
            out.append(session.run(["logits"], feeds_for(names, input_ids, [len(r) for r in rows]))[0])
        p_got = self.decide.sigmoid(np.concatenate(out).astype(np.float32))
        cfg = self.release.config
        dc = parity.decision_report(
            self.texts, self.p_ref, p_got, self.thresholds, self.labels, cfg.near_margin, cfg.hierarchy, self.decide
        )
        return {
            "agreement": round(dc["agreement"], 5),
            "changed_sets": dc["changed"],
            "changed_labels": dc["label_decisions_changed"],
            "prob_max_abs_diff": round(float(np.abs(self.p_ref - p_got).max()), 4),
            "texts": len(self.texts),
        }


def speed(models: dict[str, Path], release, texts: list[str], seconds: float, rounds: int) -> dict[str, Any]:
    """In-process sentences/s per model: tokenize → pad → ORT (one thread), 1 and 8 texts per run."""
    from seqcls.profiles.checks import feeds_for
    from seqcls.serving import shipped

    text_mod = shipped.text()
    tok = text_mod.build_tokenizer(release.checkpoint.vocab_file, max_length=release.config.max_length)
    sessions = {}
    for name, path in models.items():
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sessions[name] = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    rates: dict[str, dict[int, list[float]]] = {n: {1: [], 8: []} for n in models}
    for _ in range(rounds):
        for batch in (1, 8):
            for name, session in sessions.items():
                names = [i.name for i in session.get_inputs()]
                done, i, t0 = 0, 0, time.perf_counter()
                while time.perf_counter() - t0 < seconds:
                    chunk = [texts[(i + k) % len(texts)] for k in range(batch)]
                    i += batch
                    ids = text_mod.encode(tok, chunk)
                    a, _ = text_mod.pad(ids)
                    session.run(["logits"], feeds_for(names, a, [len(x) for x in ids]))
                    done += batch
                rates[name][batch].append(done / (time.perf_counter() - t0))
    out = {}
    for name in models:
        bs1, bs8 = statistics.median(rates[name][1]), statistics.median(rates[name][8])
        out[name] = {"bs1": round(bs1, 1), "bs8": round(bs8, 1)}
    base = out.get("fp32")
    if base:
        for v in out.values():
            v["bs1_vs_fp32"] = round(v["bs1"] / base["bs1"], 2)
            v["bs8_vs_fp32"] = round(v["bs8"] / base["bs8"], 2)
    return out


def study_checkpoint(
    checkpoint: Path, home: Path, golden: list[str] | None, held_out: list[str], recipes, args
) -> dict[str, Any]:
    """Candidates on one checkpoint: scores on golden / held-out texts (+ models for the speed run)."""
    import onnx

    from seqcls.profiles.optimize import optimize_onnx
    from seqcls.records import fp32_onnx
    from seqcls.steps import run_release
    from seqcls.steps.validate import golden_texts

    release = release_for(checkpoint, "fp32", home)
    run_release(release, until="convert")
    texts = golden if golden is not None else golden_texts(release)[0]
    fp32 = fp32_onnx(release.workspace)
    cand_dir = home / "candidates"
    cand_dir.mkdir(parents=True, exist_ok=True)
    fused = cand_dir / "fp32-fused.onnx"
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
    if not fused.is_file():
        optimize_onnx(fp32, fused, "fp32-fused", num_heads=heads, hidden_size=hidden)
    calibration = Calibration(
        tuple(texts),
        "golden",
        release.checkpoint.vocab_file,
        release.checkpoint.do_lower_case,
        release.config.max_length,
    )
    feeds = calibration.batches(graph_inputs(onnx.load(str(fused), load_external_data=False)))
    scorers = {"golden": Scorer(release, texts)}
    if held_out:
        scorers["held_out"] = Scorer(release, held_out)
    rows: dict[str, Any] = {}
    models = {"fp32": fp32, "fp32-fused": fused}
    for name, path in models.items():
        rows[name] = {k: s.score(path) for k, s in scorers.items()}
    for recipe in recipes:
        path = cand_dir / f"{recipe.name}.onnx"
        t0 = time.perf_counter()
        try:
            facts = quantize_int8(fused, path, recipe, feeds if recipe.calibrated else None)
        except Exception as exc:  # a candidate that does not build is a result too
            rows[recipe.name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            log.warning("int8 study: %s failed: %s", recipe.name, rows[recipe.name]["error"])
            continue
        rows[recipe.name] = {k: s.score(path) for k, s in scorers.items()}
        rows[recipe.name]["quantize_seconds"] = round(time.perf_counter() - t0, 1)
        rows[recipe.name]["fp32_nodes"] = len(facts["fp32_nodes"])
        rows[recipe.name]["mb"] = round(path.stat().st_size / 1e6, 1)
        models[recipe.name] = path
        g = rows[recipe.name]["golden"]
        log.info(
            "int8 study: %s — agreement %.4f, %d sets changed, max|Δp| %.3f",
            recipe.name,
            g["agreement"],
            g["changed_sets"],
            g["prob_max_abs_diff"],
        )
    return {"rows": rows, "models": models, "release": release, "texts": texts}


def gate(checkpoint: Path, home: Path, fresh: bool = True) -> dict[str, Any]:
    """The real release with profile ``int8`` (the recipe in quantize.py): the gate's figures.

    ``fresh``: its workspace is removed first — a changed quantize.py does not change the convert
    step's inputs, so a kept workspace would skip convert and gate the old served model."""
    import shutil

    from seqcls.errors import GateError
    from seqcls.steps import run_release
    from seqcls_tools.bench.facts import gate_facts, parity_report

    if fresh:
        shutil.rmtree(home / "profile-int8", ignore_errors=True)
    release = release_for(checkpoint, "int8", home)
    try:
        run_release(release, until="validate")
    except GateError as exc:
        log.warning("int8 study: gate failed: %s", str(exc)[:300])
    report = parity_report(release.workspace)
    facts = gate_facts(report) if report else {}
    facts.pop("changes", None)
    opt = (
        release.workspace.step("convert")["summary"].get("optimize", {})
        if release.workspace.succeeded("convert")
        else {}
    )
    facts["recipe"] = opt.get("quantization", {}).get("name")
    facts["calibration"] = opt.get("quantization", {}).get("calibration")
    return facts


def _fmt_row(name: str, row: dict[str, Any], sp: dict[str, Any] | None) -> str:
    if "error" in row:
        return f"  {name:24s} ERROR {row['error'][:90]}"
    g, h = row["golden"], row.get("held_out")
    held = f"{h['agreement']:.4f} {h['changed_sets']:3d}/{h['texts']:<4d}" if h else " " * 14
    speed_s = f"{sp['bs1_vs_fp32']:5.2f}x {sp['bs8_vs_fp32']:5.2f}x" if sp and "bs1_vs_fp32" in sp else ""
    return (
        f"  {name:24s} {g['agreement']:.4f} {g['changed_sets']:3d}/{g['texts']:<3d} {g['prob_max_abs_diff']:7.4f}"
        f"   {held}  {speed_s}"
    )


def main(argv: list[str] | None = None) -> None:
    from seqcls_tools.bench.model import MEDIUM, TINY

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--spec", choices=("medium", "tiny"), default="medium")
    parser.add_argument("--demo", type=Path, default=None, help="a demo checkpoint (seqcls_tools.demo.train)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/seqcls-int8-study"))
    parser.add_argument("--only", nargs="*", default=None, help="candidate names to run (default: all)")
    parser.add_argument("--held-out", type=int, default=256, help="corpus texts scored besides the golden set")
    parser.add_argument("--speed-seconds", type=float, default=2.0)
    parser.add_argument("--speed-rounds", type=int, default=3)
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--gate", action="store_true", help="also run the real int8 release gate per checkpoint")
    parser.add_argument("--keep-gate", action="store_true", help="reuse the gate's workspace (skips convert)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)

    spec = MEDIUM if args.spec == "medium" else TINY
    recipes = [r for r in CANDIDATES if args.only is None or r.name in args.only]
    if INT8 not in recipes and (args.only is None or INT8.name in args.only):
        recipes.append(replace(INT8, name=f"{INT8.name} (profile)"))
    results: dict[str, Any] = {"spec": spec.to_dict(), "profile_recipe": INT8.name, "checkpoints": {}}
    speed_done = False
    targets: list[tuple[str, Path, Path, list[str] | None, list[str]]] = []
    for seed in args.seeds:
        ckpt, corpus = bench_checkpoint(args.work, spec, seed, 2000, 64)
        targets.append((f"{spec.name} seed {seed}", ckpt, ckpt.parent / "home", corpus[-64:], corpus[: args.held_out]))
    if args.demo:
        targets.append(("demo", args.demo, args.work / "demo-home", None, []))
    for label, ckpt, home, golden, held in targets:
        t0 = time.perf_counter()
        st = study_checkpoint(ckpt, home, golden, held, recipes, args)
        entry: dict[str, Any] = {"rows": st["rows"], "seconds": round(time.perf_counter() - t0, 1)}
        if not args.no_speed and not speed_done and label != "demo":
            speed_texts = [t for t in (held or st["texts"])]
            entry["speed"] = speed(st["models"], st["release"], speed_texts, args.speed_seconds, args.speed_rounds)
            results["speed_on"] = label
            results["speed"] = entry["speed"]
            speed_done = True
        if args.gate:
            entry["gate"] = gate(ckpt, home, fresh=not args.keep_gate)
        results["checkpoints"][label] = entry
        args.work.mkdir(parents=True, exist_ok=True)
        (args.work / "int8_study.json").write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")

    sp = results.get("speed", {})
    print(f"\nINT8 study ({spec.name}; gate min agreement 0.995; speed on {results.get('speed_on')})")
    print(f"  {'candidate':24s} golden: agree  sets  max|Δp|   held-out: agree sets    bs1 / bs8 vs fp32")
    for label, entry in results["checkpoints"].items():
        print(f"{label}:")
        for name, row in entry["rows"].items():
            print(_fmt_row(name, row, sp.get(name) if label == results.get("speed_on") else None))
        if "gate" in entry:
            g = entry["gate"]
            print(
                f"  GATE (profile int8 = {g.get('recipe')}): passed {g.get('passed')}, agreement "
                f"{g.get('decision_agreement')}, {g.get('label_sets_changed')} label sets changed"
            )
    if sp:
        print("in-process sentences/s (1 thread):")
        for name, v in sp.items():
            print(f"  {name:24s} bs1 {v['bs1']:7.1f}  bs8 {v['bs8']:7.1f}")
    print(f"results: {args.work / 'int8_study.json'}")


if __name__ == "__main__":
    main()
