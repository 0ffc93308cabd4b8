"""What the served version predicted lately: its counters on every Triton replica, over a window.

Why windows need care: the counters live in the serving models' stub processes, so every replica
exports its own and each starts again at 0 when its version is (re)loaded. Prometheus, when there
is one (``SEQCLS_PROMETHEUS_URL``), already handles that (``increase(...[window])`` over all
replicas). Without one, each run appends a reading of every replica to
``$SEQCLS_HOME/monitor/<model>.jsonl`` and a window is the difference to the newest reading at or
before its start, replica by replica: a counter lower than before (a reload) counts from the
restart; no reading that old means "since the version was loaded". Every such fallback is said in
the report's notes, and a replica that does not answer is named while the others still count.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from seqcls.contract import shipped
from seqcls.contract.names import ModelName, require_name
from seqcls.errors import InputError, ServingError
from seqcls.files import atomic_write
from seqcls.monitoring.drift import Counts, DriftReport, Thresholds, compare
from seqcls.monitoring.reference import Reference
from seqcls.serving import metrics
from seqcls.serving.repository import Repository
from seqcls.serving.state import current_state
from seqcls.settings import ENV_TRITON_METRICS, Settings, prometheus_url

log = logging.getLogger(__name__)

SNAPSHOT_DIR = "monitor"
#: Readings older than this are dropped; those older than a day are thinned to one per hour.
KEEP_READINGS = timedelta(days=35)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SINCE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_since(text: str) -> timedelta:
    """``"30m"``, ``"1h"``, ``"2d"`` (s, m, h, d, w) → a positive timedelta."""
    m = _SINCE.match(str(text).lower())
    if not m or float(m[1]) <= 0:
        raise InputError(f"--since {text!r}: expected a positive number and a unit, e.g. 30m, 1h, 2d (s, m, h, d, w)")
    return timedelta(seconds=float(m[1]) * _UNITS[m[2]])


def describe_duration(delta: timedelta) -> str:
    """``1h``, ``1h 2m``, ``45s``: the two largest units (a window's age need not be round)."""
    seconds, parts = round(delta.total_seconds()), []
    for unit in ("w", "d", "h", "m", "s"):
        count, seconds = divmod(seconds, _UNITS[unit])
        if count:
            parts.append(f"{count}{unit}")
    return " ".join(parts[:2]) or "0s"


def when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# ----------------------------------------------------------------------------- reading the replicas


def counts_from_samples(samples: Iterable[metrics.Sample], model_name: str) -> dict[int, Counts]:
    """The seqcls counters of ``model_name`` per Triton version (series of one exposition, or summed)."""
    c = shipped.contract()
    ours = {c.METRIC_TEXTS, c.METRIC_UNLABELED, c.METRIC_LABEL_PREDICTIONS, f"{c.METRIC_TOP_CONFIDENCE}_bucket"}
    acc: dict[int, dict[str, Any]] = {}
    for s in samples:
        version = s.labels.get("version", "")
        if s.name not in ours or s.labels.get("model") != model_name or not version.isdigit():
            continue
        v = acc.setdefault(int(version), {"texts": 0, "labels": {}, "unlabeled": 0, "confidence": {}})
        n = round(s.value)
        if s.name == c.METRIC_TEXTS:
            v["texts"] += n
        elif s.name == c.METRIC_UNLABELED:
            v["unlabeled"] += n
        elif s.name == c.METRIC_LABEL_PREDICTIONS and "label" in s.labels:
            v["labels"][s.labels["label"]] = v["labels"].get(s.labels["label"], 0) + n
        elif s.name == f"{c.METRIC_TOP_CONFIDENCE}_bucket" and "le" in s.labels:
            le = float(s.labels["le"])  # "+Inf" → inf
            v["confidence"][le] = v["confidence"].get(le, 0) + n
    return {version: Counts(**v) for version, v in acc.items()}


@dataclass(frozen=True)
class Reading:
    """Every replica's counters of one model at one moment (what a snapshot line holds)."""

    at: float
    replicas: dict[str, dict[int, Counts]]  # endpoint → version → counts
    errors: dict[str, str] = field(default_factory=dict)  # endpoint → why it was not read

    def to_json(self) -> str:
        replicas = {ep: {str(v): c.to_dict() for v, c in versions.items()} for ep, versions in self.replicas.items()}
        return json.dumps({"at": self.at, "time": when(self.at), "replicas": replicas}, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Reading:
        data = json.loads(line)
        replicas = {
            str(ep): {int(v): Counts.from_dict(c) for v, c in versions.items()}
            for ep, versions in data["replicas"].items()
        }
        return cls(float(data["at"]), replicas)

    def total(self, version: int) -> Counts:
        out = Counts()
        for versions in self.replicas.values():
            out = out.plus(versions.get(version, Counts()))
        return out

    def versions(self) -> set[int]:
        return {v for versions in self.replicas.values() for v in versions}


def read_replicas(endpoints: Sequence[str], model_name: str, *, timeout: float = 10.0) -> Reading:
    """Scrape every replica's ``/metrics``; one that does not answer is recorded in ``errors``."""
    replicas, errors = {}, {}
    for ep in endpoints:
        try:
            replicas[ep] = counts_from_samples(metrics.scrape(ep, timeout=timeout), model_name)
        except ServingError as exc:
            log.warning("%s", exc)
            errors[ep] = str(exc)
    return Reading(time.time(), replicas, errors)


# ----------------------------------------------------------------------------- snapshots


@dataclass(frozen=True)
class SnapshotStore:
    """The readings of one model, one JSON line each, oldest first."""

    path: Path

    @classmethod
    def for_model(cls, settings: Settings, model: ModelName) -> SnapshotStore:
        return cls(settings.home / SNAPSHOT_DIR / f"{require_name(model)}.jsonl")

    def load(self) -> list[Reading]:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        out = []
        for number, line in enumerate(lines, 1):
            try:
                out.append(Reading.from_json(line))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("%s line %d is not a reading (%s): skipped", self.path, number, exc)
        return sorted(out, key=lambda r: r.at)

    def base(self, readings: Sequence[Reading], start: float) -> Reading | None:
        """The newest reading at or before ``start``."""
        before = [r for r in readings if r.at <= start]
        return before[-1] if before else None

    def append(self, reading: Reading, earlier: Sequence[Reading]) -> None:
        """Add ``reading``; rewrite the file when old readings are to be dropped or thinned."""
        if not reading.replicas:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = thinned(earlier, reading.at)
        if len(kept) < len(earlier):
            atomic_write(self.path, "".join(r.to_json() + "\n" for r in (*kept, reading)))
            return
        with self.path.open("a", encoding="utf-8") as fh:  # one short write: concurrent runs append whole lines
            fh.write(reading.to_json() + "\n")


def thinned(readings: Sequence[Reading], now: float) -> list[Reading]:
    """Drop readings older than :data:`KEEP_READINGS`; keep one per hour of those older than a day."""
    out, hours = [], set()
    for r in readings:
        age = now - r.at
        if age > KEEP_READINGS.total_seconds():
            continue
        if age > 86400:
            hour = int(r.at // 3600)
            if hour in hours:
                continue
            hours.add(hour)
        out.append(r)
    return out


# ----------------------------------------------------------------------------- windows


@dataclass
class Window:
    """Counts per version over the window, and how they were obtained."""

    counts: dict[int, Counts]
    text: str
    basis: str  # "since_load" | "snapshot" | "prometheus"
    start: float | None = None
    notes: list[tuple[int | None, str]] = field(default_factory=list)  # (the version it is about, or None)
    replicas: dict[str, str] = field(default_factory=dict)

    def notes_for(self, version: int) -> list[str]:
        return [text for v, text in self.notes if v in (None, version)]


def window_since(current: Reading, base: Reading | None, version: int) -> tuple[Counts, list[str]]:
    """``version``'s counts from ``base`` to ``current``, replica by replica (resets counted from the restart)."""
    out, notes = Counts(), []
    for ep, versions in current.replicas.items():
        now_counts = versions.get(version)
        if now_counts is None:
            continue
        before = base.replicas.get(ep, {}).get(version) if base is not None else None
        if base is not None and before is None:
            notes.append(
                f"{ep}: v{version} has no counters in the reading of {when(base.at)}: counted since it was loaded"
            )
        elif before is not None and now_counts.reset_since(before):
            notes.append(
                f"{ep}: v{version}'s counters restarted after {when(base.at)} (reloaded): counted from the restart"
            )
        elif before is not None:
            now_counts = now_counts.minus(before)
        out = out.plus(now_counts)
    return out, notes


def from_replicas(
    settings: Settings, model_name: str, since: timedelta | None, *, timeout: float = 10.0, record: bool = True
) -> Window:
    """Scrape every replica, window by the snapshot store, and append this reading to it."""
    endpoints = tuple(settings.triton_metrics)
    if not endpoints:
        raise InputError(f"no Triton metrics endpoint: set {ENV_TRITON_METRICS}=host:8002,... (one per replica)")
    current = read_replicas(endpoints, model_name, timeout=timeout)
    if not current.replicas:
        raise ServingError(
            f"no Triton replica's metrics could be read ({'; '.join(current.errors.values())}): "
            f"start Triton or fix {ENV_TRITON_METRICS}"
        )
    store = SnapshotStore.for_model(settings, model_name)
    readings = store.load()
    base = store.base(readings, current.at - since.total_seconds()) if since is not None else None
    counts: dict[int, Counts] = {}
    notes: list[tuple[int | None, str]] = []
    for version in current.versions():
        counts[version], version_notes = window_since(current, base, version)
        notes += [(version, n) for n in version_notes]
    if since is None:
        text, basis = "since each replica loaded it", "since_load"
    elif base is None:
        text, basis = f"since each replica loaded it (no reading {describe_duration(since)} old yet)", "since_load"
        cutoff = when(current.at - since.total_seconds())
        notes.append(
            (
                None,
                f"no reading of {model_name} from before {cutoff} in {store.path}: counted since the "
                "version was loaded (each run records one; the next runs can window)",
            )
        )
    else:
        text, basis = (
            f"since {when(base.at)} ({describe_duration(timedelta(seconds=current.at - base.at))} ago)",
            "snapshot",
        )
    if record:
        store.append(current, readings)
    replicas = {ep: "ok" for ep in current.replicas} | current.errors
    return Window(counts, text, basis, base.at if base is not None else None, notes, replicas)


# ----------------------------------------------------------------------------- Prometheus


def _query(url: str, promql: str, at: float, timeout: float) -> list[dict[str, Any]]:
    """One instant query of Prometheus' HTTP API → its result vector."""
    target = f"{url.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"})
    try:
        with urllib.request.urlopen(target, timeout=timeout) as resp:  # an operator-set endpoint
            data = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:  # a bad query: Prometheus says why in a JSON body
        raise ServingError(f"Prometheus at {url} refused {promql!r}: HTTP {exc.code} {exc.read()[:500]!r}") from exc
    except (OSError, ValueError) as exc:
        raise ServingError(
            f"Prometheus at {url} did not answer {promql!r}: {exc}; check SEQCLS_PROMETHEUS_URL"
        ) from exc
    if data.get("status") != "success" or data.get("data", {}).get("resultType") != "vector":
        raise ServingError(f"Prometheus at {url} refused {promql!r}: {data.get('error') or data}")
    return data["data"]["result"]


def from_prometheus(url: str, model_name: str, since: timedelta, *, timeout: float = 10.0) -> Window:
    """Counts over ``since`` from Prometheus: ``increase`` handles resets, ``sum`` adds the replicas."""
    c, at = shipped.contract(), time.time()
    rng, sel = f"{max(int(since.total_seconds()), 1)}s", f'model="{model_name}"'
    queries = {
        "texts": f"sum by (version) (increase({c.METRIC_TEXTS}{{{sel}}}[{rng}]))",
        "unlabeled": f"sum by (version) (increase({c.METRIC_UNLABELED}{{{sel}}}[{rng}]))",
        "labels": f"sum by (version, label) (increase({c.METRIC_LABEL_PREDICTIONS}{{{sel}}}[{rng}]))",
        "confidence": f"sum by (version, le) (increase({c.METRIC_TOP_CONFIDENCE}_bucket{{{sel}}}[{rng}]))",
    }
    samples = []
    for kind, promql in queries.items():
        name = {"texts": c.METRIC_TEXTS, "unlabeled": c.METRIC_UNLABELED, "labels": c.METRIC_LABEL_PREDICTIONS}.get(
            kind, f"{c.METRIC_TOP_CONFIDENCE}_bucket"
        )
        for row in _query(url, promql, at, timeout):
            value = float(row["value"][1])
            if math.isfinite(value):
                samples.append(metrics.Sample(name, {**row["metric"], "model": model_name}, value))
    text = f"since {when(at - since.total_seconds())} ({describe_duration(since)}, Prometheus)"
    return Window(
        counts_from_samples(samples, model_name),
        text,
        "prometheus",
        at - since.total_seconds(),
        replicas={f"prometheus {url}": "ok"},
    )


# ----------------------------------------------------------------------------- the served version


@dataclass(frozen=True)
class Served:
    """The served Triton version of a model and the baseline it was released with."""

    version: int
    reference: Reference
    metric_labels: list[str] | None


def served(settings: Settings, model_name: str) -> Served:
    """What the recorded state serves, and its ``release.json`` reference (none: re-release it)."""
    repo = Repository.from_settings(settings, model_name)
    state = current_state(repo.root, model_name)
    if state.serving is None:
        raise ServingError(f"{model_name}: no served version is recorded in {repo.root}; release one first")
    version, c = state.serving, shipped.contract()
    try:
        info = repo.release_info(version)
    except ValueError as exc:
        raise ServingError(
            f"{model_name} Triton v{version}: its release.json is not JSON ({exc}); run `seqcls status`"
        ) from exc
    if info is None:
        raise ServingError(f"{model_name} Triton v{version} has no release.json in {repo.root}; run `seqcls status`")
    raw = info.get(c.REFERENCE_KEY)
    if not isinstance(raw, dict):
        raise ServingError(
            f"no reference recorded for {model_name} Triton v{version} (published before monitoring): re-release it "
            "so that its release.json carries the reference distribution live traffic is compared with"
        )
    try:
        reference = Reference.from_dict(raw)
    except TypeError as exc:
        raise ServingError(
            f"{model_name} Triton v{version}: the recorded reference is malformed ({exc}); re-release it"
        ) from exc
    if reference.texts <= 0:
        raise ServingError(
            f"{model_name} Triton v{version}: its reference counts no texts; re-release it with an eval set"
        )
    labels = info.get(c.METRIC_LABELS_KEY)
    return Served(version, reference, [str(x) for x in labels] if isinstance(labels, list) else None)


def monitor(
    settings: Settings,
    model_name: str,
    since: timedelta | str | None = None,
    *,
    thresholds: Thresholds | None = None,
    prometheus: str | None = None,
    timeout: float = 10.0,
    record: bool = True,
) -> DriftReport:
    """Compare the served version's live label shares with its reference over ``since`` (None: since load).

    ``prometheus`` (default ``SEQCLS_PROMETHEUS_URL``) is asked when a window is given; otherwise every
    replica in ``settings.triton_metrics`` is scraped and, with ``record``, the reading kept for later windows.
    """
    window = parse_since(since) if isinstance(since, str) else since
    target = served(settings, model_name)
    url = prometheus if prometheus is not None else prometheus_url()
    if url and window is not None:
        live = from_prometheus(url, model_name, window, timeout=timeout)
    else:
        live = from_replicas(settings, model_name, window, timeout=timeout, record=record)
    counts = live.counts.get(target.version, Counts())
    report = compare(target.reference, counts, thresholds, target.metric_labels)
    notes = live.notes_for(target.version) + report.notes
    if not live.counts:
        notes.append(
            f"no seqcls series for {model_name} on any replica: versions published before monitoring export none, "
            "and a version's series appear with its first request"
        )
    notes += [f"replica {ep} not read: {why}" for ep, why in live.replicas.items() if why != "ok"]
    window_info = {
        "text": live.text,
        "basis": live.basis,
        "since": describe_duration(window) if window else None,
        "start": when(live.start) if live.start else None,
    }
    others = {v: c.texts for v, c in sorted(live.counts.items()) if v != target.version}
    return replace(
        report,
        model_name=model_name,
        version=target.version,
        window=window_info,
        notes=notes,
        replicas=live.replicas,
        other_versions=others,
    )
