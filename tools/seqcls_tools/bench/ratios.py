"""The benchmark's ratios against the issue's targets, each with the measured values it was computed from.

Throughput and latency come from the interleaved head-to-head medians when classic ran there (the
machine's other load hits every contender alike), else from the sequential serving matrix.
"""

from __future__ import annotations

from typing import Any

from seqcls.spec import EXACT_PROFILES

TARGETS = {
    "exact_vs_classic": 1.5,
    "fastest_vs_classic": 2.5,
    "served_vs_inprocess": 0.9,
    "lone_vs_inprocess": 0.9,
    "auto_vs_inprocess": 0.1,  # |auto's recorded rate / the bench's - 1| at most this
    "multi_text_vs_single": 1.0,
    "every_concurrency_vs_classic": 1.0,
    "tokenizer_rss_mb": 100.0,
    # on a CPU with AMX (amx_int8 or amx_bf16), beside the general ones: where AMX tiles multiply int8/bf16
    "fastest_vs_classic_amx": 4.5,
    "bf16_vs_classic_amx": 3.5,
}
#: CPU flags under which the ``*_amx`` targets are checked too (the run's ``meta.machine.isa``).
AMX_FLAGS = ("amx_int8", "amx_bf16")


def cell_value(entry: dict[str, Any] | None, clients: int, per_request: int, key: str):
    if not entry:
        return None
    for cell in entry.get("cells", []):
        if cell["clients"] == clients and cell["texts_per_request"] == per_request:
            return cell.get(key)
    return None


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


class _Measured:
    """The numbers a ratio reads: one run's configurations and where throughput/latency come from."""

    def __init__(self, results: dict[str, Any]) -> None:
        self.results = results
        self.configs: dict[str, dict[str, Any]] = results.get("configs", {})
        self.classic = self.configs.get("classic")
        self.top = max(results.get("meta", {}).get("clients", [8]))
        self.h2h = (results.get("head_to_head") or {}).get("configs", {})
        #: perf_analyzer's medians drive the headline when it ran (the Python client's stay beside them)
        self.pa = "" if self.h2h.get("classic", {}).get(f"pa_median_{self.top}c_sentences_per_s") is None else "pa_"
        self.source = "interleaved head-to-head, median" if "classic" in self.h2h else "matrix"
        if self.source != "matrix":
            self.source = ("perf_analyzer, " if self.pa else "Python client, ") + self.source

    def throughput(self, name: str | None, client: str | None = None) -> float | None:
        if not name:
            return None
        if self.source != "matrix":
            prefix = self.pa if client is None else client
            return self.h2h.get(name, {}).get(f"{prefix}median_{self.top}c_sentences_per_s")
        return cell_value(self.configs.get(name), self.top, 1, "sentences_per_s")

    def p95_1(self, name: str | None, client: str | None = None) -> float | None:
        if not name:
            return None
        if self.source != "matrix":
            return self.h2h.get(name, {}).get(f"{self.pa if client is None else client}median_1c_p95_ms")
        return cell_value(self.configs.get(name), 1, 1, "p95_ms")

    def python_client(self, name: str | None, p95: bool = False) -> dict[str, Any] | None:
        """The Python client's head-to-head figure beside perf_analyzer's headline one."""
        if not name or not self.pa:
            return None
        value = self.p95_1(name, "") if p95 else self.throughput(name, "")
        base = self.p95_1("classic", "") if p95 else self.throughput("classic", "")
        return {"value": value, "baseline": base, "ratio": round(value / base, 2) if value and base else None}

    def matrix(self, name: str | None, key: str = "sentences_per_s") -> float | None:
        """``key`` at the top client count, single-text requests, from the serving matrix."""
        return cell_value(self.configs.get(name) if name else None, self.top, 1, key)

    def best(self, exact: bool) -> tuple[str | None, float | None]:
        names = [n for n, e in self.configs.items() if _gated(self.results, e, exact=exact)]
        if self.source != "matrix":
            names = [n for n in names if n in self.h2h]
        pool = {n: self.throughput(n) for n in names}
        pool = {n: v for n, v in pool.items() if v}
        if not pool:
            return None, None
        name = max(pool, key=pool.__getitem__)
        return name, pool[name]


#: The two headline ratios: key, exact parity required, what is compared.
VS_CLASSIC = (
    ("exact_vs_classic", True, "best exact-parity profile vs classic"),
    ("fastest_vs_classic", False, "fastest gated profile vs classic"),
)


def _vs_classic(m: _Measured, key: str, exact: bool, label: str) -> dict[str, Any]:
    base = m.throughput("classic")
    name, value = m.best(exact)
    ratio = round(value / base, 2) if value and base else None
    matrix = m.matrix(name) if name else None
    matrix_base = cell_value(m.classic, m.top, 1, "sentences_per_s")
    return {
        "key": key,
        "what": f"{label}, {m.top} clients, single-text requests, sentences/s ({m.source})",
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
        "python_client": m.python_client(name),
        "note": _smoke_note(m.configs[name]) if name else None,
    }


def _p95(m: _Measured, name: str) -> dict[str, Any]:
    p95, base_p95 = m.p95_1(name), m.p95_1("classic")
    return {
        "key": f"p95_1_client[{name}]",
        "what": f"{name}: p95 at 1 client (single text) vs classic's, ms ({m.source})",
        "config": name,
        "value": p95,
        "baseline": base_p95,
        "ratio": round(p95 / base_p95, 2) if p95 and base_p95 else None,
        "target": "<= 1.0",
        "passed": p95 is not None and base_p95 is not None and p95 <= base_p95,
        "python_client": m.python_client(name, p95=True),
    }


def _at_least(target: str, key: str, what: str, name: str, value: float | None, base: float | None) -> dict[str, Any]:
    """A ratio ``value / base`` that must reach ``TARGETS[target]``."""
    ratio = round(value / base, 2) if value and base else None
    return {
        "key": key,
        "what": what,
        "config": name,
        "value": value,
        "baseline": base,
        "ratio": ratio,
        "target": TARGETS[target],
        "passed": ratio is not None and ratio >= TARGETS[target],
    }


def _served_vs_inprocess(m: _Measured, name: str) -> dict[str, Any]:
    limit = m.configs[name].get("inprocess", {}).get("batch1", {}).get("sentences_per_s")
    what = f"{name}: served ({m.top} clients x 1 text) vs in-process limit (batch 1, same thread layout)"
    return _at_least("served_vs_inprocess", f"served_vs_inprocess[{name}]", what, name, m.matrix(name), limit)


def _lone_vs_inprocess(m: _Measured, name: str) -> dict[str, Any]:
    """A lone request (1 client, single texts) against the same work in process, timed in alternating blocks:
    1000 / p50 ms on both sides, so the ratio is in-process p50 over served p50 (1.0: serving costs nothing)."""
    lone = m.configs[name].get("lone") or {}
    served = (lone.get("served") or {}).get("client_p50_ms")
    inproc = (lone.get("inprocess") or {}).get("p50_ms")
    what = f"{name}: served lone request (1 client x 1 text, p50) vs the same work in process (p50), as sentences/s"
    value, base = (round(1000.0 / x, 2) if x else None for x in (served, inproc))
    out = _at_least("lone_vs_inprocess", f"lone_vs_inprocess[{name}]", what, name, value, base)
    floor = lone.get("floor") or {}
    if floor.get("ceiling") is not None:  # what an empty python model leaves: a miss it explains is the backend's
        out["ceiling"] = floor["ceiling"]
        out["note"] = (
            f"an empty python model's lone request takes {floor['p50_ms']:.2f} ms here: with this work no python "
            f"model exceeds {floor['ceiling']:.2f}x"
        )
    return out


def _auto_vs_inprocess(m: _Measured, name: str) -> dict[str, Any]:
    """``profile: auto``'s single-text rate (:mod:`.auto_rates`) against the bench's in-process limit of the same
    profile: within 10 % either way, or auto chooses on rates that are not what is measured here."""
    auto = ((m.results.get("auto") or {}).get("profiles") or {}).get(m.configs[name].get("profile")) or {}
    value = auto.get("single_sentences_per_s")
    limit = m.configs[name].get("inprocess", {}).get("batch1", {}).get("sentences_per_s")
    ratio = round(value / limit, 2) if value and limit else None
    tolerance = TARGETS["auto_vs_inprocess"]
    at = auto.get("concurrent_sentences_per_s")
    return {
        "key": f"auto_vs_inprocess[{name}]",
        "what": f"{name}: profile auto's recorded single-text rate vs the in-process limit (batch 1), sentences/s"
        + (f"; auto at {m.top} clients {at} vs served {m.matrix(name)}" if at else ""),
        "config": name,
        "value": value,
        "baseline": limit,
        "ratio": ratio,
        "target": f"{1 - tolerance:g}–{1 + tolerance:g}",
        "passed": ratio is not None and abs(value / limit - 1) <= tolerance,
    }


def _profiles(m: _Measured) -> list[str]:
    """Every profile of the run (the main configurations; classic and the fp32 variants are configurations,
    not profiles): each is held to the served-vs-in-process targets — one not served is a miss saying why."""
    return [n for n, e in m.configs.items() if e.get("group") == "main"]


def _unserved(m: _Measured, name: str, ratio: dict[str, Any]) -> dict[str, Any]:
    entry = m.configs[name]
    if not entry.get("cells"):
        ratio["note"] = f"not served: {entry.get('skipped') or entry.get('error') or 'not measured'}"[:300]
    return ratio


def _multi_text(m: _Measured, name: str) -> dict[str, Any]:
    """Served per-sentence rate of multi-text requests against single-text ones, same clients."""
    per = max((c["texts_per_request"] for c in m.configs[name].get("cells", [])), default=1)
    multi = cell_value(m.configs[name], m.top, per, "sentences_per_s") if per > 1 else None
    what = f"{name}: served sentences/s, {m.top} clients x {per} texts vs {m.top} clients x 1 text (matrix)"
    return _at_least("multi_text_vs_single", f"multi_text_vs_single[{name}]", what, name, multi, m.matrix(name))


def _every_concurrency(m: _Measured, name: str) -> dict[str, Any]:
    """The worst single-text cell against classic's at the same client count: "faster everywhere",
    not only at the headline concurrency (a batcher that spins at 3-4 clients shows here)."""
    cells = [c for c in m.configs[name].get("cells", []) if c["texts_per_request"] == 1]
    pairs = [
        (c["clients"], c["sentences_per_s"], cell_value(m.classic, c["clients"], 1, "sentences_per_s")) for c in cells
    ]
    pairs = [(k, v, b) for k, v, b in pairs if v and b]
    worst = min(pairs, key=lambda p: p[1] / p[2]) if pairs else None
    what = f"{name}: worst single-text cell vs classic's at the same clients" + (
        f" ({worst[0]} clients), sentences/s (matrix)" if worst else " (matrix)"
    )
    key = f"every_concurrency_vs_classic[{name}]"
    return _at_least("every_concurrency_vs_classic", key, what, name, *(worst[1:] if worst else (None, None)))


def _cpu_per_sentence(m: _Measured, name: str) -> dict[str, Any]:
    cpu = m.matrix(name, "cpu_ms_per_sentence")
    base_cpu = cell_value(m.classic, m.top, 1, "cpu_ms_per_sentence")
    return {
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


def _tokenizer_rss(m: _Measured) -> dict[str, Any]:
    rss = [
        (n, e.get("max_rss_mb", {}).get("tokenizer"))
        for n, e in m.configs.items()
        if e.get("cells") and e.get("options", {}).get("tokenizer_impl") == "hf"
    ]
    rss = [(n, v) for n, v in rss if v is not None]
    classic_rss = (m.classic or {}).get("max_rss_mb", {}).get("tokenizer")
    worst = max(rss, key=lambda x: x[1]) if rss else (None, None)
    return {
        "key": "tokenizer_rss_mb",
        "what": "tokenizer stub RSS (HF tokenizers), largest over configurations, MB",
        "config": worst[0],
        "value": worst[1],
        "baseline": classic_rss,
        "ratio": round(worst[1] / classic_rss, 2) if worst[1] and classic_rss else None,
        "target": f"<= {TARGETS['tokenizer_rss_mb']:.0f} MB",
        "passed": worst[1] is not None and worst[1] <= TARGETS["tokenizer_rss_mb"],
    }


def _hot_reload(results: dict[str, Any]) -> dict[str, Any]:
    hr = results.get("hot_reload") or {}
    return {
        "key": "hot_reload_failed",
        "what": "hot reload under load: failed requests",
        "config": f"{hr.get('from_profile')} → {hr.get('to_profile')}" if hr else None,
        "value": hr.get("failed"),
        "baseline": hr.get("requests"),
        "ratio": None,
        "target": "0",
        "passed": bool(hr) and hr.get("failed") == 0 and not hr.get("error"),
    }


def ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured values it was computed from."""
    m = _Measured(results)
    out = [_vs_classic(m, *spec) for spec in VS_CLASSIC]
    chosen = sorted({r["config"] for r in out if r["config"]})
    for name in chosen:
        out += [_p95(m, name), _multi_text(m, name), _every_concurrency(m, name)]
    for name in _profiles(m):  # at 1 client and at the top concurrency, every profile the host served
        for check in (_lone_vs_inprocess, _served_vs_inprocess, _auto_vs_inprocess):
            out.append(_unserved(m, name, check(m, name)))
    out += _amx(m, out[1])
    out += [_cpu_per_sentence(m, name) for name in chosen]
    out += [_tokenizer_rss(m), _hot_reload(results)]
    return out


def _amx(m: _Measured, fastest: dict[str, Any]) -> list[dict[str, Any]]:
    """On a CPU with AMX: the fastest gated profile and bf16 against classic, held to the AMX targets (the same
    head-to-head figures as the general lines); bf16 not served there is a miss saying why."""
    isa = (m.results.get("meta", {}).get("machine") or {}).get("isa") or {}
    if not any(isa.get(flag) for flag in AMX_FLAGS):
        return []
    flags = "/".join(f for f in AMX_FLAGS if isa.get(f))
    what = (
        f"on this AMX CPU ({flags}): {{}} vs classic, {m.top} clients, single-text requests, sentences/s ({m.source})"
    )
    base = m.throughput("classic")
    out = [_at_least("fastest_vs_classic_amx", "fastest_vs_classic_amx", what.format("fastest gated profile"),
                     fastest.get("config"), fastest.get("value"), base)]  # fmt: skip
    bf16 = m.configs.get("bf16")
    served = bf16 is not None and _gated(m.results, bf16, exact=False)
    value = m.throughput("bf16") if served else None
    row = _at_least("bf16_vs_classic_amx", "bf16_vs_classic_amx", what.format("bf16"), "bf16", value, base)
    if not served:
        row["note"] = "bf16 was not served in this run (not released, its gate failed, or no cells)"
    return [*out, row]
