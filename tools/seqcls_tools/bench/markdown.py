"""The benchmark's Markdown report (``results.md``), one function per section, and the ratio lines."""

from __future__ import annotations

from typing import Any

from seqcls_tools.bench import conditions
from seqcls_tools.bench.lone import OWN, REMAINDER
from seqcls_tools.bench.ratios import TARGETS


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _cores(value: float | None) -> str:
    """CPU cores, two decimals: a load generator's 0.02–0.04 cores must not print as 0.0; a share below 0.01 says so."""
    if value is None:
        return "—"
    return "< 0.01" if 0 < value < 0.005 else f"{value:.2f}"


def _header(results: dict[str, Any]) -> list[str]:
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
    return lines


def _serving_rows(name: str, entry: dict[str, Any]) -> list[str]:
    if not entry.get("cells"):
        reason = entry.get("skipped") or entry.get("error") or "not measured"
        return [f"| {name} | {entry.get('description', '')} | — | — | — | — | — | — | — | — | — | — | {reason} |"]
    rows = []
    for cell in entry["cells"]:
        cores = cell.get("cpu_cores", {})
        rows.append(
            f"| {name} | {entry.get('description', '')} | {cell['clients']} | {cell['texts_per_request']} | "
            f"{_fmt(cell['sentences_per_s'])} | {_fmt(cell['p50_ms'])} | {_fmt(cell['p95_ms'])} | "
            f"{_fmt(cell['p99_ms'])} | {_fmt(cell['triton_batch'].get('seqcls_model'), 2)} | "
            f"{_fmt(cell['triton_batch'].get('tokenizer'), 2)} | "
            f"{_cores(cores.get('total'))} / {_cores(cores.get('client'))} | "
            f"{_fmt(cell.get('cpu_ms_per_sentence'))} | {cell['failed']} |"
        )
    return rows


def _conditions(results: dict[str, Any], section: str) -> list[str]:
    """The section's ``Conditions:`` line and a blank line ([] when the run has none for it)."""
    cond = results.get("conditions", {}).get(section)
    return [conditions.line(cond), ""] if cond else []


def _titled_table(
    title: str, header: str, align: str, rows: list[str], results: dict[str, Any], section: str
) -> list[str]:
    """A ``## title`` section holding one table, its conditions under the heading."""
    return ["", f"## {title}", "", *_conditions(results, section), header, align, *rows]


def _serving(results: dict[str, Any]) -> list[str]:
    rows = [row for name, entry in results.get("configs", {}).items() for row in _serving_rows(name, entry)]
    lines = _titled_table(
        "Serving (real local Triton, gRPC over loopback)",
        "| profile | configuration | clients | texts/req | sentences/s | p50 ms | p95 ms | p99 ms | "
        "model batch | tokenizer batch | CPU cores (server+stubs / client) | CPU ms/sentence | failed |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
        rows,
        results,
        "serving",
    )
    if results.get("fp32_winner"):
        lines += [
            "",
            "fp32 configuration that wins (least CPU per sentence at 8 clients × 1 text — wall-clock "
            f"sentences/s swings with the machine's other load): **{results['fp32_winner']}** — its options "
            "serve fp32-fused and int8.",
        ]
    return lines


def _head_to_head(results: dict[str, Any]) -> list[str]:
    h2h = results.get("head_to_head")
    if not (h2h and h2h.get("configs")):
        return []
    top = max(results.get("meta", {}).get("clients", [8]))
    lines = [
        "",
        f"Head-to-head: every contender's server up at once, cells interleaved, {h2h.get('rounds')} rounds of "
        f"{h2h.get('seconds_per_cell')} s (medians; the ratios below use these):",
        "",
        *_conditions(results, "head_to_head"),
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
    if h2h.get("perf_analyzer"):
        lines += [
            "",
            f"The same cells by perf_analyzer ({h2h['perf_analyzer']}; the headline ratios use these), "
            "with its own CPU:",
            "",
            f"| profile | {top} clients sentences/s (median) | 1 client p95 ms (median) | client cores at {top} |",
            "|---|---:|---:|---:|",
        ]
        for name, e in h2h["configs"].items():
            lines.append(
                f"| {name} | {_fmt(e.get(f'pa_median_{top}c_sentences_per_s'))} | "
                f"{_fmt(e.get('pa_median_1c_p95_ms'))} | {_cores(e.get(f'pa_median_{top}c_client_cores'))} |"
            )
    return lines


def _lone_table(name: str, lone: dict[str, Any]) -> list[str]:
    served, inproc = lone["served"], lone["inprocess"]
    lines = [
        "",
        f"### {name}",
        "",
        "| part | ms per request | share of client latency | detail |",
        "|---|---:|---:|---|",
    ]
    for part in served["parts"]:
        model = served["models"].get(part["part"])
        if model:
            detail = ", ".join(f"{p.replace('compute_', '')} {model[f'{p}_ms']:.3f}" for p in OWN)
            detail += f"; its hand-off (compute_output, in the remainder) {model['compute_output_ms']:.3f}"
        else:
            rest = served["remainder"]
            detail = (
                f"of which hand-offs (the models' compute_output) {rest['hand_offs_ms']:.3f}; "
                f"client − ensemble total (gRPC, client; < 0 when Triton's span outlasts the reply) "
                f"{rest['outside_ensemble_ms']:.3f}"
            )
        share = f"{100 * part['share']:.0f} %" if part.get("share") is not None else "—"
        lines.append(f"| {part['part']} | {part['ms']:.3f} | {share} | {detail} |")
    lines.append(
        f"| **client latency (mean)** | **{served['client_mean_ms']:.3f}** | 100 % | "
        f"p50 {served['client_p50_ms']:.3f}, p95 {served['client_p95_ms']:.3f}; "
        f"ensemble total (Triton) {served['ensemble_ms']:.3f}; "
        f"{served['requests']} requests, Triton counted {served['ensemble_requests']} |"
    )
    steps = ", ".join(f"{k} {v:.3f}" for k, v in inproc["steps_ms"].items())
    lines.append(
        f"| in process (tokenize → ORT → decide, mean) | {inproc['mean_ms']:.3f} | — | "
        f"{steps}; p50 {inproc['p50_ms']:.3f} |"
    )
    ratio = lone["served_over_inprocess"]
    lines.append(f"| **served / in process** | **{ratio['p50']:.2f}×** (p50) | — | mean {ratio['mean']:.2f}× |")
    lines.append(lone_verdict(served["client_p50_ms"], inproc["p50_ms"]))
    floor = lone.get("floor")
    if floor:
        lines.append(
            f"| floor: an empty python model (p50) | {floor['p50_ms']:.3f} | — | in process p50 "
            f"{floor['inprocess_p50_ms']:.3f} beside it: no python model's lone speed exceeds "
            f"**{floor['ceiling']:.2f}×** here |"
        )
    return lines


def lone_verdict(served_p50_ms: float, inprocess_p50_ms: float) -> str:
    """The lone request's speed against its target: in-process p50 over served p50 (1.00×: serving is free)."""
    target = TARGETS["lone_vs_inprocess"]
    speed = inprocess_p50_ms / served_p50_ms if served_p50_ms > 0 else 0.0
    verdict = "PASS" if speed >= target else "MISS"
    return f"| **lone speed (in process / served, p50)** | **{speed:.2f}×** | — | {verdict}: target ≥ {target}× |"


def lone_section(results: dict[str, Any]) -> list[str]:
    lone = {n: e["lone"] for n, e in results.get("configs", {}).items() if e.get("lone")}
    if not lone:
        return []
    lines = [
        "",
        "## A lone request, part by part (Triton's statistics)",
        "",
        *_conditions(results, "lone"),
        "Per request, ms (means over the sequential requests): each composing model's own work — queue + "
        "compute_input + compute_infer as Triton counts them (a python stub's compute_infer includes the IPC "
        f"round trip to its process); **{REMAINDER}** = client latency − the models' own work. A model's "
        "compute_output ends after its response was sent, which runs the ensemble's next step (for the last "
        "one, the reply), so it is the hand-off and counted in the remainder: the parts do not overlap, and "
        "none is < 0.",
    ]
    for name, entry in lone.items():
        lines += _lone_table(name, entry)
    return lines


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _pa_lone(lone: dict[str, Any]) -> str:
    """perf_analyzer's lone p50 and, in brackets, the in-process p50 timed right after it (— not measured)."""
    pa, inproc = lone.get("perf_analyzer_p50_ms"), lone.get("perf_analyzer_inprocess_p50_ms")
    return "—" if pa is None else f"{pa:.2f} ({_fmt(inproc, 2)})"


def direct_section(results: dict[str, Any]) -> list[str]:
    """The ensemble and the direct layout of the same version, each against the in-process limit; then the
    floor: an empty python model's lone request, and the lone speed it leaves any python model."""
    entries = {n: e["direct"] for n, e in results.get("configs", {}).items() if e.get("direct")}
    if not entries:
        return []
    rows, floors = [], []
    for name, d in entries.items():
        for layout, x in d["layouts"].items():
            lone, load = x["lone"], x["load"]
            rows.append(
                f"| {name} | {layout} | {lone['p50_ms']:.2f} | {_pa_lone(lone)} | {d['inprocess']['p50_ms']:.2f} | "
                f"{_ratio(lone['speed_vs_inprocess'])} | {_ratio(lone.get('perf_analyzer_speed_vs_inprocess'))} | "
                f"{_fmt(load['sentences_per_s'])} | "
                f"{_fmt(d['inprocess']['limit_sentences_per_s'])} | {_ratio(load['speed_vs_inprocess'])} | "
                f"{_fmt(load['p95_ms'])} | {load['failed']} | {d['differing'] if layout == 'direct' else ''} |"
            )
        f = d.get("floor")
        if f:
            ceiling = f["ceiling"]
            floors.append(
                f"| {name} | {f['p50_ms']:.2f} | {_pa_lone(f)} | "
                f"{d['inprocess']['p50_ms']:.2f} | {_ratio(ceiling.get('python'))} | "
                f"{_ratio(ceiling.get('perf_analyzer'))} |"
            )
    clients = next(iter(entries.values()))["layouts"]["direct"]["load"]["clients"]
    lines = [
        "",
        "## The direct layout beside the ensemble (the same version, one server)",
        "",
        *_conditions(results, "lone"),
        "direct: the version's tokenizer, model and postprocess steps in one python model (one stub hop), as "
        "SEQCLS_SERVING_PIPELINE=direct publishes it; "
        f"ensemble: the classic three. Lone: sequential single-text requests, p50, each in blocks alternating "
        "with the same work in process (the Python gRPC client); perf_analyzer: the same texts from its C++ "
        "client at concurrency 1 after them, then in process back to back (its p50 in brackets), and its speed "
        f"is against that; {clients} clients: single texts back to back, two alternating "
        "halves per layout. Speed = served / in process (1.00× = the in-process limit); in process: one session "
        "of the served threads, one text at a time, timed between the requests and averaged. Answers ≠: "
        "texts (each alone) whose labels or probabilities differ from the ensemble's.",
        "",
        "| profile | layout | lone p50 ms | perf_analyzer p50 ms (in process) | in process p50 ms | lone speed | "
        f"perf_analyzer speed | {clients} clients sentences/s | in-process limit /s | {clients}-client speed | "
        "p95 ms | failed | answers ≠ |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]
    if floors:
        lines += [
            "",
            "**The floor of one python stub hop**: lone requests to an empty python model with the same input, "
            "batching and instances (it answers each text with itself), beside the same in-process runs. Ceiling "
            "= in process / (in process + the floor): the lone speed of a python model that cost nothing beyond "
            "its own work and the empty model's hop; a target above it needs a model outside the python backend.",
            "",
            "| profile | empty model p50 ms | perf_analyzer p50 ms (in process) | in process p50 ms | ceiling | "
            "ceiling (perf_analyzer) |",
            "|---|---:|---:|---:|---:|---:|",
            *floors,
        ]
    return lines


def _inprocess_rows(name: str, entry: dict[str, Any]) -> list[str]:
    o = entry.get("options", {})
    layout = f"{o.get('model_instances')}x{o.get('intra_op_threads')} ORT {o.get('graph_optimization_level')}"
    return [
        f"| {name} | {layout} | {v['batch_size']} | {'each text alone' if v.get('per_text') else 'padded'} "
        f"| {_fmt(v['sentences_per_s'])} | {_fmt(v['p50_ms'])} | {_fmt(v['p95_ms'])} | "
        f"{_fmt(v.get('cpu_ms_per_sentence'))} |"
        for v in entry.get("inprocess", {}).values()
    ]


def _inprocess(results: dict[str, Any]) -> list[str]:
    return _titled_table(
        "In-process limit (HF tokenizer + ONNX Runtime, same model and thread layout, no server)",
        "| profile | layout (instances x threads) | texts per batch | run | sentences/s | p50 ms | p95 ms | "
        "CPU ms/sentence |",
        "|---|---|---:|---|---:|---:|---:|---:|",
        [row for name, entry in results.get("configs", {}).items() for row in _inprocess_rows(name, entry)],
        results,
        "inprocess",
    )


def _memory(results: dict[str, Any]) -> list[str]:
    rows = [
        f"| {name} | {_fmt(rss.get('server'))} | {_fmt(rss.get('tokenizer'))} | "
        f"{_fmt(rss.get('seqcls_model'))} | {_fmt(rss.get('seqcls_postprocess'))} |"
        for name, rss in ((n, e.get("max_rss_mb", {})) for n, e in results.get("configs", {}).items())
        if rss
    ]
    return _titled_table(
        "Memory (largest RSS per process role, MB)",
        "| profile | server | tokenizer stub | model stub | postprocess stub |",
        "|---|---:|---:|---:|---:|",
        rows,
        results,
        "memory",
    )


def _tokenizers(results: dict[str, Any]) -> list[str]:
    tok = results.get("tokenizers", {})
    if not tok:
        return []
    rows = [
        f"| {key.split('/')[0]} | {v['batch_size']} | {_fmt(v['sentences_per_s'])} | "
        f"{_fmt(v.get('sentences_per_cpu_s'))} |"
        for key, v in tok.items()
    ]
    return _titled_table(
        "Tokenizer throughput (one process, one thread calling)",
        "| tokenizer | texts per call | sentences/s | sentences per CPU-s |",
        "|---|---:|---:|---:|",
        rows,
        results,
        "tokenizers",
    )


def _release_row(profile: str, entry: dict[str, Any]) -> str:
    steps = entry.get("steps", {})
    gate = entry.get("gate", {})
    conv = entry.get("convert", {})
    opt = conv.get("optimize", {}) or {}
    size = conv.get("served_bytes") or opt.get("bytes") or conv.get("bytes")
    fusions = ", ".join(f"{k} {v}" for k, v in opt.get("fusions", {}).items()) or "—"
    return (
        f"| {profile} | {_fmt(steps.get('export'))} | {_fmt(steps.get('convert'))} | "
        f"{_fmt(steps.get('validate'))} | {_fmt(size / 1e6 if size else None)} | {fusions} | "
        f"{'passed' if entry.get('gate_passed') else 'FAILED'} | {_fmt(gate.get('label_sets_changed'))} | "
        f"{_fmt(gate.get('decision_agreement'), 4)} | {_fmt(gate.get('logits_max_abs_diff'), 6)} |"
    )


def _served_steps(results: dict[str, Any]) -> list[str]:
    serve_steps = [
        (n, e.get("steps", {}), e.get("smoke", {})) for n, e in results.get("configs", {}).items() if e.get("steps")
    ]
    if not serve_steps:
        return []
    lines = ["", "| served as | publish s | reload s | smoke s | smoke |", "|---|---:|---:|---:|---|"]
    for n, s, sm in serve_steps:
        lines.append(
            f"| {n} | {_fmt(s.get('publish'))} | {_fmt(s.get('reload'))} | {_fmt(s.get('smoke'))} | {_smoke_text(sm)} |"
        )
    return lines


def _releases(results: dict[str, Any]) -> list[str]:
    rel = results.get("releases", {})
    if not rel:
        return []
    lines = _titled_table(
        "Release steps (this model)",
        "| profile | export s | convert s | validate s | served file MB | fusions | gate | label sets changed | "
        "decision agreement | logits max abs diff |",
        "|---|---:|---:|---:|---:|---|---|---:|---:|---:|",
        [_release_row(profile, entry) for profile, entry in rel.items()],
        results,
        "releases",
    )
    return lines + _served_steps(results)


def _batch_dependence(results: dict[str, Any]) -> list[str]:
    dep = results.get("batch_dependence")
    if not dep:
        return []
    lines = [
        "",
        "Same answer alone and batched? Golden texts run one at a time vs in padded batches of 16 "
        "(how validate runs them), served model, ORT on 1 thread:",
        "",
        *_conditions(results, "batch_dependence"),
        "| profile | texts | label sets that differ | max abs diff probability | served |",
        "|---|---:|---:|---:|---|",
    ]
    for profile, v in dep.items():
        served = v.get("served", "")
        lines.append(
            f"| {profile} | {v['texts']} | {v['label_sets_changed']} | {v['prob_max_abs_diff']:.2g} | {served} |"
        )
    return lines


def _hot_reload(results: dict[str, Any]) -> list[str]:
    hr = results.get("hot_reload")
    if not hr:
        return []
    return [
        "",
        "## Hot reload under load",
        "",
        *_conditions(results, "hot_reload"),
        f"{hr.get('from_profile')} → {hr.get('to_profile')} (version {hr.get('to_version')}) while 4 clients "
        f"sent single-text requests: publish {hr.get('publish_seconds')} s, reload {hr.get('reload_seconds')} s; "
        f"{hr.get('requests')} requests, **{hr.get('failed')} failed**, p95 {hr.get('p95_ms')} ms, "
        f"p99 {hr.get('p99_ms')} ms during the switch" + (f"; error: {hr['error']}" if hr.get("error") else ""),
    ]


def _peaks(host: dict[str, Any]) -> str:
    peaks = "; ".join(f"{p} **{v['gflops']:.0f} GFLOP/s** ({v['how']})" for p, v in host.get("peaks", {}).items())
    missing = "; ".join(f"{p}: {why}" for p, why in host.get("not_measured", {}).items())
    return peaks + (f"; not measured — {missing}" if missing else "")


def _unmeasured(results: dict[str, Any]) -> list[str]:
    """The profiles the roofline table has no row for, and why (a failed gate, a host without the instructions)."""
    why = {
        n: e.get("skipped") or e.get("error") or "not measured"
        for n, e in results.get("configs", {}).items()
        if e.get("group") != "variant" and not e.get("cells")
    }
    why.update(results.get("meta", {}).get("profiles_left_out", {}))
    return [f"- no row for {', '.join(f'{n} ({reason})' for n, reason in why.items())}"] if why else []


def roofline_section(results: dict[str, Any]) -> list[str]:
    """The host's roofline, the model's cost per text, and each profile's rates as a fraction of its roofline."""
    roof = results.get("roofline") or {}
    host, model, rows = roof.get("host"), roof.get("model"), roof.get("profiles")
    if not (host and model and rows):
        return []
    shape = model["shape"]
    weights = ", ".join(f"{p} {mb:.1f} MB" for p, mb in model["weight_mb"].items())
    table = [
        f"| {r['profile']} | {r['where']} | {r['precision']} | {r['batch']:.2g} | {_fmt(r['texts_per_s'])} | "
        f"{r['roofline_texts_per_s']:.1f} | {r['limit']} | "
        f"{_fmt(r['fraction'], 2)} |"
        for r in rows
    ]
    return [
        "",
        "## Roofline: each profile against this host's limit",
        "",
        *_conditions(results, "roofline"),
        f"- host: {host['cpu_model']}, matrix flags {', '.join(host['flags']) or 'none'}; measured on "
        f"{host['threads']} thread(s) in {host['seconds']} s before any server started",
        f"- memory bandwidth **{host['bandwidth_gb_s']:.1f} GB/s** ({host['bandwidth_how']})",
        f"- matrix peaks: {_peaks(host)}",
        f"- model: {shape['layers']} layers, hidden {shape['hidden']}, intermediate {shape['intermediate']}, vocab "
        f"{shape['vocab']}, {shape['labels']} labels — {shape['encoder_matmul_params'] / 1e6:.1f} M encoder matrix "
        f"weights + {shape['head_params'] / 1e6:.2f} M head; at {model['tokens']:.1f} tokens ({model['tokens_from']}) "
        f"**{model['gflops_per_text']:.2f} GFLOP per text**; weights streamed per execution: {weights}",
        "- roofline = min(peak / FLOPs per text, bandwidth × texts per execution / weight bytes); texts per "
        "execution is 1 where each text runs alone (int8, bf16, per-text fp32 of mixed lengths, in process)",
        *_unmeasured(results),
        "",
        "| profile | rate | precision | texts per execution | sentences/s | roofline sentences/s | bound | "
        "fraction of roofline |",
        "|---|---|---|---:|---:|---:|---|---:|",
        *table,
    ]


#: The report's sections, in order (the ratios close it).
SECTIONS = (
    _header,
    _serving,
    _head_to_head,
    roofline_section,
    lone_section,
    _inprocess,
    _memory,
    _tokenizers,
    _releases,
    _batch_dependence,
    _hot_reload,
)


def markdown(results: dict[str, Any]) -> str:
    lines = [line for section in SECTIONS for line in section(results)]
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
        py = r.get("python_client") or {}
        if py.get("ratio") is not None:
            line += f"; Python client: {_fmt(py.get('value'))} vs {_fmt(py.get('baseline'))} → {py['ratio']}x"
        if r.get("note"):
            line += f" — NOTE: {r['note']}"
        out.append(f"- {line}" if markdown else line)
    return out
