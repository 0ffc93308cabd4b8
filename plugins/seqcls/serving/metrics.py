"""Triton's Prometheus metrics (``/metrics`` on the metrics port, 8002 by default), read the way a
scraper reads them.

Why: the request counters are Triton's own account of what a version answered, independent of
the client that sent the requests — the smoke report quotes them next to its own count, and an
operator's dashboard shows the same series (``nv_inference_request_success{model,version}``,
``nv_inference_request_failure``, ``nv_inference_count``, ``nv_inference_exec_count``,
``nv_inference_request_duration_us``, ``nv_inference_queue_duration_us``).
"""

from __future__ import annotations

import logging
import re
import urllib.request
from dataclasses import dataclass

from seqcls.errors import ServingError

log = logging.getLogger(__name__)

COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count")
_QUOTED = r'"(?:[^"\\]|\\.)*"'  # a label value: escapes (\\, \", \n) and any '}' inside
_SAMPLE = re.compile(rf'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{{(?P<labels>(?:[^"}}]|{_QUOTED})*)\}}\s+(?P<value>\S+)')
_LABEL = re.compile(rf"(\w+)=({_QUOTED})")
_ESCAPE = re.compile(r"\\(.)")


def _unescape(value: str) -> str:
    """A label value as exposed (``\\\\``, ``\\"``, ``\\n`` escaped) → the value itself."""
    return _ESCAPE.sub(lambda m: "\n" if m[1] == "n" else m[1], value)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    """Prometheus text exposition → samples that carry labels (comments and bare series skipped)."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            try:
                value = float(m["value"])
            except ValueError:
                continue
            labels = {k: _unescape(v[1:-1]) for k, v in _LABEL.findall(m["labels"])}
            out.append(Sample(m["name"], labels, value))
    return out


def scrape(url: str, *, timeout: float = 10.0) -> list[Sample]:
    """GET ``url`` (``http://host:8002/metrics``) and parse it."""
    target = url if url.startswith(("http://", "https://")) else f"http://{url}"
    if not target.rstrip("/").endswith("/metrics"):
        target = target.rstrip("/") + "/metrics"
    try:
        with urllib.request.urlopen(target, timeout=timeout) as resp:  # an operator-set endpoint
            return parse(resp.read().decode("utf-8", "replace"))
    except OSError as exc:
        raise ServingError(f"Triton metrics at {target} unreachable: {exc}") from exc


def counts(samples: list[Sample], model: str, version: int) -> dict[str, float]:
    """The request counters of one model version (missing series count 0)."""
    out = dict.fromkeys(COUNTERS, 0.0)
    for s in samples:
        if s.name in out and s.labels.get("model") == model and s.labels.get("version") == str(version):
            out[s.name] += s.value
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    return {k: int(after.get(k, 0) - before.get(k, 0)) for k in COUNTERS}
