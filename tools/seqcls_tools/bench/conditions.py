"""The conditions every table of the report was measured under, from the run's own results.

A speed figure means little without the CPU (model and the flags its kernels use), the threads it
ran on, the batch and request shape, the lengths of the texts, who generated the load — and, on a
shared machine, how busy it was (load average at the run's start and end). One
entry per report section (``results["conditions"][section]``), each rendered as one
``Conditions:`` line under the section's heading by :mod:`.markdown`.
"""

from __future__ import annotations

from typing import Any

from seqcls_tools.bench.machine import isa_text

PYTHON_CLIENT = (
    "Python gRPC client (tritonclient) in the bench process, one thread and client per concurrent client, "
    "requests back to back"
)


STUBS = "tokenizer and postprocess: 1 stub each"


def _served(configs: dict[str, Any], only: set[str] | None = None) -> dict[str, dict[str, Any]]:
    return {n: e for n, e in configs.items() if e.get("options") and (only is None or n in only)}


def _threads(configs: dict[str, dict[str, Any]]) -> str:
    layouts = ", ".join(
        f"{n} {e['options']['model_instances']}×{e['options']['intra_op_threads']}" for n, e in configs.items()
    )
    return f"model instances × ORT intra-op threads (inter-op 1): {layouts or '—'}; {STUBS}"


def _batching(configs: dict[str, dict[str, Any]]) -> str:
    def one(e: dict[str, Any]) -> str:
        o = e["options"]
        if not o.get("dynamic_batching"):
            return "off"
        return f"on ≤ {o.get('max_batch_size')}, {o.get('batching')}"

    return "Triton dynamic batching: " + (", ".join(f"{n} {one(e)}" for n, e in configs.items()) or "—")


def _base(results: dict[str, Any], texts: dict[str, Any] | None) -> dict[str, Any]:
    meta = results.get("meta", {})
    machine = meta.get("machine", {})
    return {
        "cpu": machine.get("cpu_model"),
        "loadavg": [meta.get("loadavg_start"), meta.get("loadavg_end")],
        "cpus": machine.get("cpus_usable") or machine.get("cpus"),
        "flags": dict(machine.get("isa", {})),
        "texts": dict(texts or {}),
    }


Conditions = dict[str, Any]


def _serving(results: dict[str, Any]) -> Conditions:
    meta, configs = results.get("meta", {}), _served(results.get("configs", {}))
    clients = "/".join(str(c) for c in meta.get("clients", []))
    per_request = "/".join(str(t) for t in meta.get("texts_per_request", []))
    return {
        "threads": _threads(configs),
        "batch": _batching(configs),
        "request": f"{per_request} texts per request, {clients} clients",
        "load": PYTHON_CLIENT,
    }


def _head_to_head(results: dict[str, Any]) -> Conditions | None:
    h2h = results.get("head_to_head") or {}
    if not h2h.get("configs"):
        return None
    contenders = _served(results.get("configs", {}), set(h2h["configs"]))
    pa = (
        f"perf_analyzer ({h2h['perf_analyzer']}; N processes × concurrency 1) and then the Python client"
        if h2h.get("perf_analyzer")
        else "the Python client alone (no perf_analyzer)"
    )
    return {
        "threads": _threads(contenders),
        "batch": _batching(contenders),
        "request": f"1 text per request, {max(results.get('meta', {}).get('clients', [8]))} and 1 clients",
        "load": f"{pa}, every contender's server up, {h2h.get('rounds')} interleaved rounds",
    }


def _lone(results: dict[str, Any]) -> Conditions | None:
    configs = {n: e for n, e in _served(results.get("configs", {})).items() if e.get("lone")}
    if not configs:
        return None
    block = next(iter(configs.values()))["lone"].get("interleaved_blocks")
    requests = results.get("meta", {}).get("budget", {}).get("lone_requests")
    return {
        "threads": _threads(configs) + "; in process: one session of the same threads, one calling thread",
        "batch": "1 (each request alone: nothing to batch with)",
        "request": "1 text per request, sequential",
        "load": f"1 Python gRPC client, {requests} sequential requests, the in-process runs of the same texts "
        f"in alternating blocks of {block}; Triton statistics read before and after",
    }


def _inprocess(results: dict[str, Any]) -> Conditions | None:
    configs = {n: e for n, e in _served(results.get("configs", {})).items() if e.get("inprocess")}
    if not configs:
        return None
    batches = sorted({v["batch_size"] for e in configs.values() for v in e["inprocess"].values()})
    return {
        "threads": _threads(configs).replace(f"; {STUBS}", "") + "; one calling thread per session",
        "batch": "texts per batch " + "/".join(str(b) for b in batches) + ", padded to the batch's longest",
        "request": "a batch at a time, back to back (no server)",
        "load": "in-process loop: tokenize → pad → ORT, no decide",
    }


def _tokenizers(results: dict[str, Any]) -> Conditions | None:
    if not results.get("tokenizers"):
        return None
    batches = sorted({v["batch_size"] for v in results["tokenizers"].values()})
    return {
        "threads": "one calling thread (HF tokenizers may use its own Rust threads for a batch)",
        "batch": "texts per call " + "/".join(str(b) for b in batches),
        "request": "no model, tokenizer only",
        "load": "in-process loop",
    }


def _releases(results: dict[str, Any]) -> Conditions | None:
    if not results.get("releases"):
        return None
    return {
        "threads": "the release steps' own settings (not the serving layout)",
        "batch": "validate: golden texts in padded batches of 16; smoke: each text alone",
        "request": "export → convert → validate once per profile; publish/reload/smoke per served configuration",
        "load": "the release steps themselves (no concurrent load)",
    }


def _batch_dependence(results: dict[str, Any]) -> Conditions | None:
    if not results.get("batch_dependence"):
        return None
    return {
        "threads": "ORT 1 intra-op thread, graph level all",
        "batch": "each text alone vs padded batches of 16",
        "request": "golden texts",
        "load": "in-process loop",
    }


def _hot_reload(results: dict[str, Any]) -> Conditions | None:
    hr = results.get("hot_reload")
    if not hr:
        return None
    served = _served(results.get("configs", {}), {hr.get("from_profile", "")})
    return {
        "threads": _threads(served),
        "batch": _batching(served),
        "request": "1 text per request, 4 clients",
        "load": PYTHON_CLIENT,
    }


def _roofline(results: dict[str, Any]) -> Conditions | None:
    roof = results.get("roofline") or {}
    if not roof.get("profiles"):
        return None
    host = roof["host"]
    served = _served(results.get("configs", {}), {r["profile"] for r in roof["profiles"]})
    return {
        "threads": f"roofline measured on {host['threads']} thread(s); the rates: {_threads(served)}",
        "batch": "texts per execution as each row says (the roofline's weight-stream reuse); " + _batching(served),
        "request": "1 text per request, 8 and 1 clients; in process: one text at a time",
        "load": "8 clients: the head-to-head's median (perf_analyzer where it ran), else the serving matrix; "
        "1 client: the serving matrix; in process: the in-process limit, batch 1",
    }


#: section -> (what its conditions say beyond the machine's, whose token lengths: the load's or the golden texts')
_BUILDERS = {
    "serving": (_serving, "tokens"),
    "head_to_head": (_head_to_head, "tokens"),
    "lone": (_lone, "tokens"),
    "inprocess": (_inprocess, "tokens"),
    "memory": (_serving, "tokens"),
    "tokenizers": (_tokenizers, "tokens"),
    "releases": (_releases, "golden_tokens"),
    "batch_dependence": (_batch_dependence, "golden_tokens"),
    "hot_reload": (_hot_reload, "tokens"),
    "roofline": (_roofline, "tokens"),
}
#: The report sections that hold tables, in report order.
SECTIONS = tuple(_BUILDERS)


def sections(results: dict[str, Any]) -> dict[str, Conditions]:
    """Conditions per section of the report, for the sections this run measured."""
    out: dict[str, Conditions] = {}
    for name, (build, texts) in _BUILDERS.items():
        specific = build(results)
        if specific is not None:
            out[name] = {**_base(results, results.get("corpus", {}).get(texts)), **specific}
    return out


def line(cond: dict[str, Any]) -> str:
    """One Markdown line naming every condition of a table."""
    t = cond.get("texts", {})
    start, end = cond.get("loadavg") or (None, None)
    texts = (
        f"{t.get('texts')} texts, tokens min {t.get('min')} / median {t.get('median')} / p95 {t.get('p95')} / "
        f"max {t.get('max')}"
        if t
        else "—"
    )
    return (
        f"*Conditions:* CPU {cond.get('cpu')}, {cond.get('cpus')} usable CPUs ({isa_text(cond.get('flags', {}))}); "
        f"threads: {cond.get('threads')}; batch: {cond.get('batch')}; request: {cond.get('request')}; "
        f"texts: {texts}; load generator: {cond.get('load')}; machine load average (1/5/15 min) at the run's "
        f"start {start}, end {end}"
    )
