"""Benchmark output: ``results.json``, a Markdown report, a PNG plot, and the ratios vs the targets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TARGETS = {
    "exact_vs_classic": 1.5,
    "fastest_vs_classic": 2.5,
    "served_vs_inprocess": 0.9,
    "tokenizer_rss_mb": 100.0,
}
EXACT_PROFILES = ("fp32", "fp32-fused")


def cell_value(entry: dict[str, Any] | None, clients: int, per_request: int, key: str):
    if not entry:
        return None
    for cell in entry.get("cells", []):
        if cell["clients"] == clients and cell["texts_per_request"] == per_request:
            return cell.get(key)
    return None


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _gated(results: dict[str, Any], entry: dict[str, Any], *, exact: bool) -> bool:
    rel = results.get("releases", {}).get(entry.get("profile"), {})
    smoke = entry.get("smoke", {})
    if entry.get("group") == "classic" or not entry.get("cells"):
        return False
    if not rel.get("gate_passed"):
        return False
    if exact:
        return (
            entry["profile"] in EXACT_PROFILES
            and rel.get("gate", {}).get("label_sets_changed") == 0
            and bool(smoke.get("passed"))
        )
    return True


def _smoke_note(entry: dict[str, Any]) -> str | None:
    smoke = entry.get("smoke", {})
    if smoke.get("passed"):
        return None
    if "label_sets_changed" in smoke:
        return (
            f"parity gate passed, but the smoke test failed: {smoke['label_sets_changed']} served label sets and "
            f"{smoke['differences']} probability rows (max abs diff {smoke['prob_max_abs_diff']}) differ from the "
            "validated ones — the release pipeline would roll this version back"
        )
    return f"smoke test failed: {str(smoke.get('error'))[:160]}"


def ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured values it was computed from."""
    configs: dict[str, dict[str, Any]] = results.get("configs", {})
    classic = configs.get("classic")
    top = max(results.get("meta", {}).get("clients", [8]))
    h2h = (results.get("head_to_head") or {}).get("configs", {})
    source = "interleaved head-to-head, median" if "classic" in h2h else "matrix"

    def throughput(name: str | None) -> float | None:
        if not name:
            return None
        if source != "matrix":
            return h2h.get(name, {}).get(f"median_{top}c_sentences_per_s")
        return cell_value(configs.get(name), top, 1, "sentences_per_s")

    def p95_1(name: str | None) -> float | None:
        if not name:
            return None
        if source != "matrix":
            return h2h.get(name, {}).get("median_1c_p95_ms")
        return cell_value(configs.get(name), 1, 1, "p95_ms")

    base = throughput("classic")
    base_p95 = p95_1("classic")
    out: list[dict[str, Any]] = []

    def best(exact: bool) -> tuple[str | None, float | None]:
        names = [n for n, e in configs.items() if _gated(results, e, exact=exact)]
        if source != "matrix":
            names = [n for n in names if n in h2h]
        pool = {n: throughput(n) for n in names}
        pool = {n: v for n, v in pool.items() if v}
        if not pool:
            return None, None
        name = max(pool, key=pool.__getitem__)
        return name, pool[name]

    for key, exact, label in (
        ("exact_vs_classic", True, "best exact-parity profile vs classic"),
        ("fastest_vs_classic", False, "fastest gated profile vs classic"),
    ):
        name, value = best(exact)
        ratio = round(value / base, 2) if value and base else None
        matrix = cell_value(configs.get(name), top, 1, "sentences_per_s") if name else None
        matrix_base = cell_value(classic, top, 1, "sentences_per_s")
        out.append(
            {
                "key": key,
                "what": f"{label}, {top} clients, single-text requests, sentences/s ({source})",
                "config": name,
                "value": value,
                "baseline": base,
                "ratio": ratio,
                "target": TARGETS[key],
                "passed": ratio is not None and ratio >= TARGETS[key],
                "matrix": {
                    "value": matrix,
                    "baseline": matrix_base,
                    "ratio": round(matrix / matrix_base, 2) if matrix and matrix_base else None,
                },
                "note": _smoke_note(configs[name]) if name else None,
            }
        )
    chosen = {r["config"] for r in out if r["config"]}
    for name in sorted(chosen):
        p95 = p95_1(name)
        out.append(
            {
                "key": f"p95_1_client[{name}]",
                "what": f"{name}: p95 at 1 client (single text) vs classic's, ms ({source})",
                "config": name,
                "value": p95,
                "baseline": base_p95,
                "ratio": round(p95 / base_p95, 2) if p95 and base_p95 else None,
                "target": "<= 1.0",
                "passed": p95 is not None and base_p95 is not None and p95 <= base_p95,
            }
        )
        served = cell_value(configs[name], top, 1, "sentences_per_s")
        limit = configs[name].get("inprocess", {}).get("batch1", {}).get("sentences_per_s")
        ratio = round(served / limit, 2) if served and limit else None
        out.append(
            {
                "key": f"served_vs_inprocess[{name}]",
                "what": f"{name}: served ({top} clients x 1 text) vs in-process limit (batch 1, same thread layout)",
                "config": name,
                "value": served,
                "baseline": limit,
                "ratio": ratio,
                "target": TARGETS["served_vs_inprocess"],
                "passed": ratio is not None and ratio >= TARGETS["served_vs_inprocess"],
            }
        )
    base_cpu = cell_value(classic, top, 1, "cpu_ms_per_sentence")
    for name in sorted(chosen):
        cpu = cell_value(configs[name], top, 1, "cpu_ms_per_sentence")
        out.append(
            {
                "key": f"cpu_per_sentence[{name}]",
                "what": f"{name}: CPU ms per sentence (server + stubs + client), classic's / this one's "
                "(independent of other load on the machine; no target)",
                "config": name,
                "value": cpu,
                "baseline": base_cpu,
                "ratio": round(base_cpu / cpu, 2) if cpu and base_cpu else None,
                "target": "info",
                "passed": True,
            }
        )
    rss = [
        (n, e.get("max_rss_mb", {}).get("tokenizer"))
        for n, e in configs.items()
        if e.get("cells") and e.get("options", {}).get("tokenizer_impl") == "hf"
    ]
    rss = [(n, v) for n, v in rss if v is not None]
    classic_rss = (classic or {}).get("max_rss_mb", {}).get("tokenizer")
    worst = max(rss, key=lambda x: x[1]) if rss else (None, None)
    out.append(
        {
            "key": "tokenizer_rss_mb",
            "what": "tokenizer stub RSS (HF tokenizers), largest over configurations, MB",
            "config": worst[0],
            "value": worst[1],
            "baseline": classic_rss,
            "ratio": round(worst[1] / classic_rss, 2) if worst[1] and classic_rss else None,
            "target": f"<= {TARGETS['tokenizer_rss_mb']:.0f} MB",
            "passed": worst[1] is not None and worst[1] <= TARGETS["tokenizer_rss_mb"],
        }
    )
    hr = results.get("hot_reload") or {}
    out.append(
        {
            "key": "hot_reload_failed",
            "what": "hot reload under load: failed requests",
            "config": f"{hr.get('from_profile')} → {hr.get('to_profile')}" if hr else None,
            "value": hr.get("failed"),
            "baseline": hr.get("requests"),
            "ratio": None,
            "target": "0",
            "passed": bool(hr) and hr.get("failed") == 0 and not hr.get("error"),
        }
    )
    return out


# ----------------------------------------------------------------------------- Markdown


def markdown(results: dict[str, Any]) -> str:
    meta = results.get("meta", {})
    machine = meta.get("machine", {})
    isa = ", ".join(k for k, v in machine.get("isa", {}).items() if v) or "—"
    lines = [
        f"# seqcls serving benchmark ({meta.get('mode')})",
        "",
        f"- started {meta.get('started')}, {meta.get('seconds')} s; load average at start "
        f"{meta.get('loadavg_start')}, at end {meta.get('loadavg_end')} (1/5/15 min)",
        f"- machine: {machine.get('cpu_model')}, {machine.get('cpus')} CPUs ({isa}); "
        + ", ".join(f"{k} {v}" for k, v in machine.get("versions", {}).items()),
    ]
    model = results.get("model", {})
    spec = model.get("spec", {})
    corpus = results.get("corpus", {})
    if spec:
        lines.append(
            f"- model: {spec.get('name')} — {spec.get('num_layers')} layers, hidden {spec.get('hidden_size')}, "
            f"{spec.get('num_heads')} heads, vocab {spec.get('vocab_size') or 'corpus'}, {spec.get('num_labels')} "
            f"labels; random weights, classifier scale {spec.get('logit_scale')}, bias "
            f"{model.get('classifier_bias')} ({model.get('labels_per_text_after_bias')} labels per text)"
        )
    if corpus:
        lines.append(
            f"- corpus: {corpus.get('sentences')} seeded zh/en/mixed sentences, {corpus.get('chars_min')}-"
            f"{corpus.get('chars_max')} chars (mean {corpus.get('chars_mean')}), tokens mean "
            f"{corpus.get('tokens_mean')}, p95 {corpus.get('tokens_p95')}"
        )
    lines += ["", "## Serving (real local Triton, gRPC over loopback)", ""]
    lines += [
        "| profile | configuration | clients | texts/req | sentences/s | p50 ms | p95 ms | p99 ms | "
        "model batch | tokenizer batch | CPU cores (server+stubs / client) | CPU ms/sentence | failed |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for name, entry in results.get("configs", {}).items():
        if not entry.get("cells"):
            reason = entry.get("skipped") or entry.get("error") or "not measured"
            lines.append(
                f"| {name} | {entry.get('description', '')} | — | — | — | — | — | — | — | — | — | — | {reason} |"
            )
            continue
        for cell in entry["cells"]:
            cores = cell.get("cpu_cores", {})
            lines.append(
                f"| {name} | {entry.get('description', '')} | {cell['clients']} | {cell['texts_per_request']} | "
                f"{_fmt(cell['sentences_per_s'])} | {_fmt(cell['p50_ms'])} | {_fmt(cell['p95_ms'])} | "
                f"{_fmt(cell['p99_ms'])} | {_fmt(cell['triton_batch'].get('seqcls_model'), 2)} | "
                f"{_fmt(cell['triton_batch'].get('tokenizer'), 2)} | "
                f"{_fmt(cores.get('total'), 2)} / {_fmt(cores.get('client'), 2)} | "
                f"{_fmt(cell.get('cpu_ms_per_sentence'))} | {cell['failed']} |"
            )
    if results.get("fp32_winner"):
        lines += [
            "",
            "fp32 configuration that wins (least CPU per sentence at 8 clients × 1 text — wall-clock "
            f"sentences/s swings with the machine's other load): **{results['fp32_winner']}** — its options "
            "serve fp32-fused and int8.",
        ]
    h2h = results.get("head_to_head")
    if h2h and h2h.get("configs"):
        top = max(meta.get("clients", [8]))
        lines += [
            "",
            f"Head-to-head: every contender's server up at once, cells interleaved, {h2h.get('rounds')} rounds of "
            f"{h2h.get('seconds_per_cell')} s (medians; the ratios below use these):",
            "",
            f"| profile | {top} clients sentences/s (median) | each round | 1 client p95 ms (median) | each round | "
            f"CPU ms/sentence at {top} clients |",
            "|---|---:|---|---:|---|---:|",
        ]
        for name, e in h2h["configs"].items():
            lines.append(
                f"| {name} | {_fmt(e.get(f'median_{top}c_sentences_per_s'))} | "
                f"{', '.join(_fmt(x) for x in e.get(f'all_{top}c_sentences_per_s', []))} | "
                f"{_fmt(e.get('median_1c_p95_ms'))} | {', '.join(_fmt(x) for x in e.get('all_1c_p95_ms', []))} | "
                f"{_fmt(e.get(f'median_{top}c_cpu_ms_per_sentence'))} |"
            )
    lines += ["", "## In-process limit (HF tokenizer + ONNX Runtime, same model and thread layout, no server)", ""]
    lines += [
        "| profile | layout (instances x threads) | texts per batch | run | sentences/s | p50 ms | p95 ms | "
        "CPU ms/sentence |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for name, entry in results.get("configs", {}).items():
        o = entry.get("options", {})
        layout = f"{o.get('model_instances')}x{o.get('intra_op_threads')} ORT {o.get('graph_optimization_level')}"
        for v in entry.get("inprocess", {}).values():
            lines.append(
                f"| {name} | {layout} | {v['batch_size']} | {'each text alone' if v.get('per_text') else 'padded'} "
                f"| {_fmt(v['sentences_per_s'])} | {_fmt(v['p50_ms'])} | {_fmt(v['p95_ms'])} | "
                f"{_fmt(v.get('cpu_ms_per_sentence'))} |"
            )
    lines += ["", "## Memory (largest RSS per process role, MB)", ""]
    lines += ["| profile | server | tokenizer stub | model stub | postprocess stub |", "|---|---:|---:|---:|---:|"]
    for name, entry in results.get("configs", {}).items():
        rss = entry.get("max_rss_mb", {})
        if rss:
            lines.append(
                f"| {name} | {_fmt(rss.get('server'))} | {_fmt(rss.get('tokenizer'))} | "
                f"{_fmt(rss.get('seqcls_model'))} | {_fmt(rss.get('seqcls_postprocess'))} |"
            )
    tok = results.get("tokenizers", {})
    if tok:
        lines += ["", "## Tokenizer throughput (one process, one thread calling)", ""]
        lines += ["| tokenizer | texts per call | sentences/s | sentences per CPU-s |", "|---|---:|---:|---:|"]
        for key, v in tok.items():
            lines.append(
                f"| {key.split('/')[0]} | {v['batch_size']} | {_fmt(v['sentences_per_s'])} | "
                f"{_fmt(v.get('sentences_per_cpu_s'))} |"
            )
    rel = results.get("releases", {})
    if rel:
        lines += ["", "## Release steps (this model)", ""]
        lines += [
            "| profile | export s | convert s | validate s | served file MB | fusions | gate | label sets changed | "
            "decision agreement | logits max abs diff |",
            "|---|---:|---:|---:|---:|---|---|---:|---:|---:|",
        ]
        for profile, entry in rel.items():
            steps = entry.get("steps", {})
            gate = entry.get("gate", {})
            conv = entry.get("convert", {})
            opt = conv.get("optimize", {}) or {}
            size = conv.get("served_bytes") or opt.get("bytes") or conv.get("bytes")
            fusions = ", ".join(f"{k} {v}" for k, v in opt.get("fusions", {}).items()) or "—"
            lines.append(
                f"| {profile} | {_fmt(steps.get('export'))} | {_fmt(steps.get('convert'))} | "
                f"{_fmt(steps.get('validate'))} | {_fmt(size / 1e6 if size else None)} | {fusions} | "
                f"{'passed' if entry.get('gate_passed') else 'FAILED'} | {_fmt(gate.get('label_sets_changed'))} | "
                f"{_fmt(gate.get('decision_agreement'), 4)} | {_fmt(gate.get('logits_max_abs_diff'), 6)} |"
            )
        serve_steps = [
            (n, e.get("steps", {}), e.get("smoke", {})) for n, e in results.get("configs", {}).items() if e.get("steps")
        ]
        if serve_steps:
            lines += ["", "| served as | publish s | reload s | smoke s | smoke |", "|---|---:|---:|---:|---|"]
            for n, s, sm in serve_steps:
                lines.append(
                    f"| {n} | {_fmt(s.get('publish'))} | {_fmt(s.get('reload'))} | {_fmt(s.get('smoke'))} | "
                    f"{_smoke_text(sm)} |"
                )
    dep = results.get("batch_dependence")
    if dep:
        lines += [
            "",
            "Same answer alone and batched? Golden texts run one at a time vs in padded batches of 16 "
            "(how validate runs them), served model, ORT on 1 thread:",
            "",
            "| profile | texts | label sets that differ | max abs diff probability |",
            "|---|---:|---:|---:|",
        ]
        for profile, v in dep.items():
            lines.append(f"| {profile} | {v['texts']} | {v['label_sets_changed']} | {v['prob_max_abs_diff']:.2g} |")
    hr = results.get("hot_reload")
    if hr:
        lines += [
            "",
            "## Hot reload under load",
            "",
            f"{hr.get('from_profile')} → {hr.get('to_profile')} (version {hr.get('to_version')}) while 4 clients "
            f"sent single-text requests: publish {hr.get('publish_seconds')} s, reload {hr.get('reload_seconds')} s; "
            f"{hr.get('requests')} requests, **{hr.get('failed')} failed**, p95 {hr.get('p95_ms')} ms, "
            f"p99 {hr.get('p99_ms')} ms during the switch" + (f"; error: {hr['error']}" if hr.get("error") else ""),
        ]
    lines += ["", "## Ratios vs targets", "", *ratio_lines(results.get("ratios", []), markdown=True), ""]
    return "\n".join(lines)


def _smoke_text(smoke: dict[str, Any]) -> str:
    if smoke.get("passed"):
        return "passed"
    if smoke.get("decisions_as_validated"):
        return (
            f"FAILED on probabilities only: every label set as validated, {smoke.get('differences')} rows with "
            f"max abs diff p {smoke.get('prob_max_abs_diff')} > the smoke's prob_atol"
        )
    if "label_sets_changed" in smoke:
        return (
            f"FAILED: {smoke['label_sets_changed']} label sets and {smoke['differences']} probability rows "
            f"(max abs diff {smoke['prob_max_abs_diff']}) differ from validate's"
        )
    return "FAILED " + str(smoke.get("error", ""))[:120]


def ratio_lines(items: list[dict[str, Any]], *, markdown: bool = False) -> list[str]:
    out = []
    for r in items:
        mark = "PASS" if r["passed"] else "MISS"
        ratio = f"{r['ratio']}x" if r.get("ratio") is not None else "—"
        if r.get("target") == "info":
            mark = "INFO"
        line = (
            f"{mark} {r['what']}: {_fmt(r.get('value'))} vs {_fmt(r.get('baseline'))} → {ratio} "
            f"(target {r['target']}{', ' + str(r['config']) if r.get('config') else ''})"
        )
        m = r.get("matrix") or {}
        if m.get("ratio") is not None and "matrix" not in r["what"]:
            line += f"; in the matrix run: {_fmt(m.get('value'))} vs {_fmt(m.get('baseline'))} → {m['ratio']}x"
        if r.get("note"):
            line += f" — NOTE: {r['note']}"
        out.append(f"- {line}" if markdown else line)
    return out


# ----------------------------------------------------------------------------- plot


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for name, entry in results.get("configs", {}).items():
        cells = sorted((c for c in entry.get("cells", []) if c["texts_per_request"] == 1), key=lambda c: c["clients"])
        if not cells:
            continue
        style = "--" if entry.get("group") == "variant" else "-"
        width = 2.2 if entry.get("group") != "variant" else 1.2
        xs = [c["clients"] for c in cells]
        axes[0].plot(xs, [c["sentences_per_s"] for c in cells], style, marker="o", lw=width, label=name)
        axes[1].plot(xs, [c["p95_ms"] for c in cells], style, marker="o", lw=width, label=name)
    axes[0].set_title("throughput, single-text requests")
    axes[0].set_ylabel("sentences / s")
    axes[1].set_title("p95 latency, single-text requests")
    axes[1].set_ylabel("ms")
    for ax in axes:
        ax.set_xlabel("concurrent clients")
        ax.set_xticks(results.get("meta", {}).get("clients", [1, 4, 8]))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    meta = results.get("meta", {})
    fig.suptitle(
        f"seqcls serving profiles ({meta.get('mode')}, {results.get('model', {}).get('spec', {}).get('name')}); "
        f"load avg {meta.get('loadavg_start')} → {meta.get('loadavg_end')}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_all(results: dict[str, Any], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "results.md", "plot": out / "plot.png"}
    paths["json"].write_text(json.dumps(results, indent=1, ensure_ascii=False, default=str), encoding="utf-8")
    paths["markdown"].write_text(markdown(results), encoding="utf-8")
    plot(results, paths["plot"])
    return paths
