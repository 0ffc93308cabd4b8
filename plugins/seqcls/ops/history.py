"""``seqcls history``: every serving change of a model, with when, who, from → to and why.

Read from the append-only log beside each recorded state (:func:`seqcls.serving.state.log_path`):
every state change (a release's candidate, its exposure, a rollback, a withdrawn candidate, a
state adopted or repaired) and every event that changed nothing served (a gate's refusal, a
champion move). Joined with MLflow, each Triton version is named with the registry version that
holds it — found as ``seqcls status`` finds it, by release key, else fingerprint — in the one
vocabulary of the project: "Triton v5 (MLflow v1)". MLflow down: the entries come without the
MLflow numbers and a note says so. A damaged log line is skipped and named in a note.
"""

from __future__ import annotations

import json
import logging
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from seqcls.contract.names import ModelName, require_name
from seqcls.ops.evidence import records
from seqcls.ops.sync import models_in, operator_models
from seqcls.registry.ledger import client, find_version
from seqcls.registry.ledger import version_label as ledger_version_label
from seqcls.registry.runs import PARITY_TAG, QUALITY_TAG
from seqcls.release.keys import served_release_key
from seqcls.serving import statelog
from seqcls.serving.repository import Repository
from seqcls.serving.s3state import S3ServingState
from seqcls.serving.state import summarize_log as state_summary
from seqcls.serving.statelog import EVENTS, Chunk, Summarizer, log_path, read_lines, read_tail, segments
from seqcls.serving.storeroot import store_at
from seqcls.settings import Settings

log = logging.getLogger(__name__)

#: The history kind of each recorded state action (:data:`seqcls.serving.state.ACTIONS`) and log event.
KINDS = {
    "candidate": "release-candidate",
    "release": "expose",
    "rollback": "rollback",
    "abandon": "withdraw",
    "adopt": "adopt",
    "repair": "sync-repair",
    "refused": "refused",
    "override": "override",
    "promote": "promote",
    "damaged": "damaged",
}


def version_label(triton: int | None, mlflow: int | None = None, *, registry: bool = True) -> str:
    """:func:`seqcls.registry.ledger.version_label`, said for a history: "nothing" for no version, and
    "(not in MLflow)" when the registry was asked and holds no version of it."""
    if triton is None:
        return f"nothing (MLflow v{mlflow})" if mlflow is not None else "nothing"
    if mlflow is None and registry:
        return f"Triton v{triton} (not in MLflow)"
    return ledger_version_label(triton, mlflow)


def who_label(who: dict[str, Any] | None, by: str = "") -> str:
    """``user@host pid N`` (+ ``dag D run R try T`` for an Airflow task); the lease owner for old lines."""
    if not isinstance(who, dict):
        return by
    text = f"{who.get('user', '?')}@{who.get('host', '?')} pid {who.get('pid', '?')}"
    if who.get("dag_id"):
        text += f" (dag {who['dag_id']} run {who.get('run_id', '?')} try {who.get('try', '?')})"
    return text


@dataclass
class HistoryEntry:
    """One serving change (or refusal) of ``model_name``, versions named in both numberings."""

    model_name: str
    at: str
    kind: str
    from_version: int | None
    to_version: int | None
    fingerprint: str | None
    who: dict[str, Any] | None = None
    by: str = ""
    reason: str = ""
    gate: str | None = None
    from_mlflow: int | None = None
    to_mlflow: int | None = None
    gates: dict[str, str] = field(default_factory=dict)
    generation: int | None = None
    line: int = 0
    #: "compacted" when gc compacted this release's evidence into its audit record (:mod:`seqcls.ops.evidence`).
    evidence: str = ""

    def describe(self, which: str, *, registry: bool = True) -> str:
        if which == "from":
            return version_label(self.from_version, self.from_mlflow, registry=registry)
        return version_label(self.to_version, self.to_mlflow, registry=registry)

    def change(self, *, registry: bool = True) -> str:
        """``Triton v4 (MLflow v3) → Triton v5 (MLflow v4)``; a refusal changes nothing: "unchanged"."""
        if self.kind in ("refused", "override"):
            return f"{self.describe('to', registry=registry)} unchanged"
        return f"{self.describe('from', registry=registry)} → {self.describe('to', registry=registry)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "from": self.describe("from"),
            "to": self.describe("to"),
            "who_label": who_label(self.who, self.by),
        }


@dataclass
class History:
    """What :func:`history` returns: the entries (oldest first) and notes on what could not be read."""

    entries: list[HistoryEntry]
    notes: list[str] = field(default_factory=list)
    registry: bool = True  # False: MLflow was not reachable, the MLflow numbers are missing
    omitted: int = 0  # older entries a limit left out (never joined with MLflow)

    def to_dict(self) -> dict[str, Any]:
        return {"entries": [e.to_dict() for e in self.entries], "notes": self.notes, "registry": self.registry}


_START = {"serving": None, "previous": None, "candidate": None}
#: The highest versions a state-log snapshot names (with their newest fingerprint) for the MLflow join.
VERSIONS_KEPT = 100


def _parse(model_name: str, path: Path, lines: list[bytes], first: int, cur: dict[str, Any]
           ) -> tuple[list[HistoryEntry], list[int], dict[str, Any]]:  # fmt: skip
    """History entries of ``lines`` (the first numbered ``first``, read after the state ``cur``), the numbers of
    the damaged ones, and the state they leave."""
    out: list[HistoryEntry] = []
    damaged: list[int] = []
    cur = dict(cur)
    for number, raw in enumerate(lines, first):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
            new, cur = _entries(model_name, record, cur, number)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("%s line %d: skipped, unreadable (%s)", path, number, str(exc)[:120])
            damaged.append(number)
            continue
        out += new
    return out, damaged, cur


def read_entries(repository: Path, model_name: str) -> tuple[list[HistoryEntry], list[int]]:
    """The whole log of ``model_name`` as history entries, oldest first, and the numbers of damaged lines."""
    path = log_path(repository, model_name)
    try:
        lines = read_lines(path)  # rotated segments first, oldest first
    except FileNotFoundError:
        return [], []
    out, damaged, _ = _parse(model_name, path, lines, 1, _START)
    return out, damaged


@dataclass
class LogRead:
    """What :func:`read_recent` read of one model's log: ``entries`` (oldest first: the newest ones at least, or
    all), and of the whole log: its damaged lines, how many entries it holds, each Triton version's newest
    fingerprint and every version it names (what the MLflow join needs)."""

    entries: list[HistoryEntry]
    damaged: list[int]
    total: int
    fingerprints: dict[int, str]
    named: set[int]
    segments_read: int = 0
    #: where the log was read (the state log's path, or the store's event log), for the notes
    where: str = ""
    #: what could not be read (the store unreachable: this host's copy was read instead)
    note: str = ""


def summarize_log(previous: dict[str, Any] | None, lines: list[bytes], first: int) -> dict[str, Any]:
    """The ``history`` part of a state-log snapshot (:func:`seqcls.serving.statelog.rotate`): the state the log
    leaves at the cut, how many entries and which damaged lines it holds, each version's newest fingerprint and
    the :data:`VERSIONS_KEPT` highest versions named — so ``history --limit`` resumes after it and joins as a read
    of the whole log does (its walk down older versions for an old champion's number stops there)."""
    prev = _snapshot_part(previous) if previous else LogRead([], [], 0, {}, set())
    cur = previous.get("cur", _START) if previous else _START
    entries, damaged, cur = _parse("", Path("the state log being rotated"), lines, first, cur)
    named = sorted(prev.named | _named(entries))[-VERSIONS_KEPT:]
    fps = {**prev.fingerprints, **_fingerprints(entries)}
    return {
        "cur": cur,
        "entries": prev.total + len(entries),
        "damaged": prev.damaged + damaged,
        "fingerprints": {str(v): fps[v] for v in named if v in fps},
        "named": named,
    }


def _snapshot_part(part: dict[str, Any]) -> LogRead:
    """A snapshot's ``history`` part as a LogRead without entries (ValueError/TypeError/KeyError when wrong)."""
    fps = {int(v): str(fp) for v, fp in dict(part["fingerprints"]).items()}
    damaged = [int(n) for n in part["damaged"]]
    return LogRead([], damaged, int(part["entries"]), fps, {int(v) for v in part["named"]})


def rotate_log(repository: Path, model_name: ModelName, max_bytes: int) -> Path | None:
    """Rotate ``model_name``'s state log when larger than ``max_bytes`` (``seqcls gc``), with the snapshot state
    recovery and ``history --limit`` resume from; the new segment, or None when it was left alone."""
    parts: dict[str, Summarizer] = {"state": state_summary, "history": summarize_log}
    return statelog.rotate(log_path(repository, model_name), max_bytes, summarizers=parts)


def read_recent(repository: Path, model_name: str, newest: int | None = None) -> LogRead:
    """At least the ``newest`` entries of ``model_name``'s log (None: all), read from its newest end: the live
    file, then older segments only while fewer were found, each resumed from the snapshot before it — so
    ``history --limit 20`` reads the same few kilobytes after years of releases. A segment whose snapshot is
    missing or unreadable is read with everything before it. On a store's working copy the store's event log
    is read instead: every host's changes are there, and a host that released nothing has no copy of its own."""
    if (store := store_at(repository)) is not None:
        side = S3ServingState(store, require_name(model_name))
        try:
            return read_store_log(side, model_name, newest)
        except Exception as exc:  # history never fails for the store: this host's copy is what is left
            note = f"{side.uri(side.log_prefix)} could not be read ({exc}); this host's copy of the log is shown"
            log.warning("%s", note)
            return replace(_read_file_log(repository, model_name, newest), note=note)
    return _read_file_log(repository, model_name, newest)


def read_store_log(side: S3ServingState, model_name: str, newest: int | None = None) -> LogRead:
    """At least the ``newest`` entries of the store's event log of ``model_name`` (None: all): its newest
    events first, four times as many again while fewer entries were found. An event is one object, so only
    what is shown is read; ``total`` counts each unread older event as one change (a second listing, made only
    when older events were left unread)."""
    last = newest
    while True:
        read = side.events(last)
        entries: list[HistoryEntry] = []
        damaged = [int(k.rsplit("/", 1)[-1].split(".")[0]) for k in read.skipped]
        cur = dict(_START)
        for event in read.events:
            record = dict(event.record)
            if record.get("event") == "state":  # a recorded state: the state log's line, on the store
                record.pop("event")
            try:
                found, cur = _entries(model_name, record, cur, event.seq)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                log.warning("%s event %d: skipped, unreadable (%s)", side.uri(side.log_prefix), event.seq, exc)
                damaged.append(event.seq)
                continue
            entries += found
        seen = len(read.events) + len(read.skipped)
        if last is None or seen < last or len(entries) >= last:  # fewer listed than asked: the whole log was read
            break
        last *= 4
    total = len(entries) + (max(0, side.event_count() - seen) if last is not None and seen >= last else 0)
    where = side.uri(side.log_prefix)
    return LogRead(entries, sorted(damaged), total, _fingerprints(entries), _named(entries), where=where)


def _read_file_log(repository: Path, model_name: str, newest: int | None) -> LogRead:
    """:func:`read_recent` of the state log file (and its rotated segments) in ``repository``."""
    path = log_path(repository, model_name)
    parsed: list[tuple[list[HistoryEntry], list[int]]] = []
    bases: list[dict[str, Any] | None] = []

    def parse(chunk: Chunk) -> bool:  # False: its snapshot part is unusable
        part = (chunk.snapshot or {}).get("parts", {}).get("history") if chunk.snapshot else None
        if chunk.snapshot is not None and not isinstance(part, dict):
            return False
        found, damaged, _ = _parse(model_name, path, chunk.lines, chunk.first, (part or {}).get("cur", _START))
        parsed.append((found, damaged))
        bases.append(part)
        return True

    def want(chunks: list[Chunk]) -> bool:
        if not parse(chunks[-1]):
            raise _Unusable
        return newest is None or sum(len(p[0]) for p in parsed) < newest

    try:
        tail = read_tail(path, want=want)
        if len(parsed) < len(tail.chunks) and not parse(tail.chunks[-1]):
            raise _Unusable
        base = _snapshot_part(bases[-1]) if bases[-1] is not None else LogRead([], [], 0, {}, set())
    except FileNotFoundError:
        return LogRead([], [], 0, {}, set())
    except (_Unusable, ValueError, TypeError, KeyError, AttributeError):
        log.warning("%s: a snapshot's history part is unusable: reading the whole log", path)
        entries, damaged = read_entries(repository, model_name)
        return LogRead(entries, damaged, len(entries), _fingerprints(entries), _named(entries), len(segments(path)))
    entries = [e for found, _ in reversed(parsed) for e in found]
    damaged = base.damaged + [n for _, d in reversed(parsed) for n in d]
    fps = {**base.fingerprints, **_fingerprints(entries)}
    return LogRead(entries, damaged, base.total + len(entries), fps, base.named | _named(entries), tail.segments_read)


class _Unusable(Exception):
    """A snapshot without a usable history part."""


def _version(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"not a version: {value!r}")
    return value


def _entries(
    model_name: str, record: dict[str, Any], cur: dict[str, Any], number: int
) -> tuple[list[HistoryEntry], dict[str, Any]]:
    """The history entries of one log line, and the serving/previous/candidate it leaves."""
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    who = record.get("who") if isinstance(record.get("who"), dict) else None
    event = record.get("event")
    if event is not None and event not in EVENTS:
        raise ValueError(f"unknown event {event!r}")
    if event in ("refused", "override", "promote", "damaged"):
        return [_event_entry(model_name, record, cur, who, number)], cur
    return _state_entries(model_name, record, cur, who, number)


def _event_entry(
    model_name: str, record: dict[str, Any], cur: dict[str, Any], who: dict | None, number: int
) -> HistoryEntry:
    """A line that changed no state: a gate's refusal, or a champion move (its MLflow numbers recorded)."""
    at, fp = str(record["at"]), record.get("fingerprint")
    if record["event"] == "promote":
        return HistoryEntry(
            model_name, at, "promote", None, _version(record.get("version")), fp, who, by=str(record.get("by", "")),
            line=number, from_mlflow=_version(record.get("mlflow_previous")), to_mlflow=_version(record.get("mlflow")),
        )  # fmt: skip
    served = _version(record.get("serving", cur["serving"]))
    gate, kind = record.get("gate"), record["event"]  # refused, or a refusal overridden (who, why)
    verdict = "overridden" if kind == "override" else "failed"
    return HistoryEntry(
        model_name, at, kind, served, served, fp, who, reason=str(record.get("reason", "")), gate=gate,
        gates={str(gate): verdict} if gate else {}, line=number,
    )  # fmt: skip


def _state_entries(
    model_name: str, record: dict[str, Any], cur: dict[str, Any], who: dict | None, number: int
) -> tuple[list[HistoryEntry], dict[str, Any]]:
    """The entries a recorded state added, each with the versions before and after it."""
    after = {k: _version(record["state"].get(k)) for k in ("serving", "previous", "candidate")}
    generation = record.get("generation")
    before = record.get("before")
    cur = {k: _version(before.get(k)) for k in cur} if isinstance(before, dict) else dict(cur)
    out: list[HistoryEntry] = []
    for e in record["entries"]:
        action, version = e["action"], _version(e.get("version"))
        if action not in KINDS or action in EVENTS:
            raise ValueError(f"unknown action {action!r}")
        frm, to = (version, cur["serving"]) if action == "abandon" else (cur["serving"], version)
        if action in ("candidate", "abandon"):
            cur["candidate"] = version if action == "candidate" else None
        else:  # release, rollback, adopt: what the public ensemble serves
            cur["serving"] = version
            cur["candidate"] = None if action == "release" else cur["candidate"]
        out.append(
            HistoryEntry(
                model_name,
                str(e["at"]),
                KINDS[action],
                frm,
                to,
                e.get("fingerprint"),
                who,
                by=str(e.get("by", "")),
                reason=str(e.get("note", "")),
                generation=generation,
                line=number,
            )
        )
    if record.get("event") == "repair":
        out.append(
            HistoryEntry(
                model_name,
                str(record["at"]),
                "sync-repair",
                cur["serving"],
                after["serving"],
                None,
                who,
                reason=str(record.get("note", "")),
                generation=generation,
                line=number,
            )
        )
    return out, after


def _fingerprints(entries: list[HistoryEntry]) -> dict[int, str]:
    """Triton version → fingerprint, from every entry that names both (the newest wins)."""
    fps: dict[int, str] = {}
    for e in entries:
        if e.kind not in ("refused", "override") and e.to_version is not None and e.fingerprint:
            fps[e.to_version] = e.fingerprint
    return fps


class _Registry:
    """The MLflow side of the join, asked once per (fingerprint, release key); stops at the first failure."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.error: str | None = None
        self._client: Any = None
        self._cache: dict[tuple[str, str | None, str | None], tuple[int | None, dict[str, str]]] = {}

    def lookup(self, model_name: str, fingerprint: str | None, key: str | None) -> tuple[int | None, dict[str, str]]:
        """(MLflow version holding this release, its gate verdicts); (None, {}) when not registered or down."""
        if self.error is not None or not (fingerprint or key):
            return None, {}
        cache_key = (model_name, fingerprint, key)
        if cache_key not in self._cache:
            try:
                self._cache[cache_key] = self._ask(model_name, fingerprint, key)
            except Exception as exc:
                self.error = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
                log.warning("history: MLflow unreachable or failing: %s", self.error)
                return None, {}
        return self._cache[cache_key]

    def _ask(self, model_name: str, fingerprint: str | None, key: str | None) -> tuple[int | None, dict[str, str]]:
        if self._client is None:
            self._client = client(self.settings)
        mv = find_version(self._client, model_name, fingerprint, release_key=key)
        if mv is None:
            return None, {}
        gates: dict[str, str] = {}
        if getattr(mv, "run_id", None):
            tags = self._client.get_run(mv.run_id).data.tags
            gates = {name: tags[tag] for name, tag in (("parity", PARITY_TAG), ("quality", QUALITY_TAG)) if tag in tags}
        return int(mv.version), gates


def _named(entries: list[HistoryEntry]) -> set[int]:
    return {x for e in entries for x in (e.from_version, e.to_version) if x is not None}


def _join(settings: Settings, model_name: str, read: LogRead, registry: _Registry, shown: list[HistoryEntry]) -> None:
    """Fill in the MLflow version (and gate verdicts) of every Triton version the ``shown`` entries name.

    Only those are looked up — one registry query each, the cost that would otherwise grow with every
    release. ``read`` (the whole log's figures, from its snapshot) still gives each version's newest recorded
    fingerprint, and the versions older lines name are asked, newest first, only while a shown champion move's
    old MLflow number is not settled — so ``shown`` gets the same numbers as a join of the whole log would give it.
    """
    repo = Repository.from_settings(settings, model_name)
    fps = read.fingerprints
    mlflow: dict[int, int | None] = {}
    gates: dict[int, dict[str, str]] = {}

    def ask(v: int) -> None:
        try:
            key = served_release_key(repo, v)
            info = repo.release_info(v) or {}
        except Exception:  # a damaged release.json: match by fingerprint alone
            key, info = None, {}
        fp = fps.get(v) or (info.get("fingerprint") if isinstance(info.get("fingerprint"), str) else None)
        mlflow[v], gates[v] = registry.lookup(model_name, fp, key)

    def settled(below: int) -> bool:  # each wanted number held by a version above every one not yet asked
        return all(any(m == mlflow[u] and u > below for u in mlflow) for m in wanted)

    wanted = {e.from_mlflow for e in shown if e.kind == "promote" and e.from_mlflow is not None}
    named = _named(shown)
    for v in sorted(named):
        ask(v)
    for v in sorted(read.named - named, reverse=True):
        if registry.error is not None or settled(v):
            break
        ask(v)
    by_mlflow = {m: v for v, m in sorted(mlflow.items()) if m is not None}  # the newest version holding m
    for e in shown:
        if e.kind == "promote":  # registry numbers recorded; the Triton version the old champion held
            e.from_version = by_mlflow.get(e.from_mlflow) if e.from_mlflow is not None else None
            continue
        e.from_mlflow = mlflow.get(e.from_version) if e.from_version is not None else None
        e.to_mlflow = mlflow.get(e.to_version) if e.to_version is not None else None
        if e.kind in ("release-candidate", "expose") and e.to_version is not None:
            e.gates = gates.get(e.to_version, {})


def _mark_compacted(settings: Settings, model_name: str, entries: list[HistoryEntry]) -> None:
    """Say which releases' evidence now lives in one audit record (their workspace went)."""
    compacted = records(settings, model_name)
    for e in entries:
        name = (e.fingerprint or "")[:16]
        if name in compacted and not (settings.releases_dir / model_name / name).is_dir():
            e.evidence = "compacted"


def history(settings: Settings, model_names: Sequence[str] | None = None, *, limit: int | None = None) -> History:
    """Every recorded serving change of the named models (default: every model with a state or log), oldest
    first, with the MLflow version of each Triton version. Never fails for MLflow or a damaged line.

    ``limit``: only the newest ``limit`` entries (across the models), cut *before* the MLflow join, so a
    daily ``history --limit`` costs the same after years of releases as after a few; the rest is counted
    in ``omitted``. Each log is read from its newest end, resumed at the state-log snapshots (:func:`read_recent`),
    only as far back as ``limit`` entries; without a limit, whole.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be 1 or more, got {limit}")
    root = Path(str(settings.triton_repository))
    names = operator_models(model_names) or models_in(root)
    registry = _Registry(settings)
    logs: dict[str, LogRead] = {}
    entries: list[HistoryEntry] = []
    notes: list[str] = []
    total = 0
    for name in names:
        read = read_recent(root, name, limit)  # newest first: each model's newest ``limit`` hold the newest overall
        if read.note:
            notes.append(read.note)
        if read.damaged:
            listed = ", ".join(str(n) for n in read.damaged[:20]) + (" …" if len(read.damaged) > 20 else "")
            where = read.where or log_path(root, name)
            notes.append(f"{where}: {len(read.damaged)} damaged line(s) skipped (line {listed})")
        logs[name] = read
        entries += read.entries
        total += read.total
    entries.sort(key=lambda e: e.at)  # stable: one model's log order is kept within a second
    entries = entries[-limit:] if limit else entries
    omitted = total - len(entries)
    kept = {id(e) for e in entries}
    for name, read in logs.items():
        shown = [e for e in read.entries if id(e) in kept]
        _mark_compacted(settings, name, shown)
        _join(settings, name, read, registry, shown)
    if registry.error is not None:
        notes.append(f"MLflow was unreachable ({registry.error}): versions are shown without their MLflow numbers")
    return History(entries, notes, registry=registry.error is None, omitted=omitted)


def lines(result: History, limit: int | None = None) -> list[str]:
    """The table ``seqcls history`` prints: newest last; then the notes."""
    entries = result.entries[-limit:] if limit else result.entries
    older = result.omitted + len(result.entries) - len(entries)
    rows = [("when", "model", "kind", "from → to", "fingerprint", "who", "reason")]
    for e in entries:
        reason = e.reason
        if e.kind == "promote":
            reason = f"MLflow champion → v{e.to_mlflow}" if e.to_mlflow is not None else "MLflow champion moved"
        if e.gates and e.kind not in ("refused", "override"):
            reason = ", ".join(f"{g} {v}" for g, v in e.gates.items()) + (f"; {reason}" if reason else "")
        elif e.gate:
            reason = f"{e.gate} gate: {reason}"
        rows.append(
            (
                e.at,
                e.model_name,
                e.kind,
                e.change(registry=result.registry),
                (e.fingerprint or "-")[:12] + (f" ({e.evidence})" if e.evidence else ""),
                who_label(e.who, e.by),
                textwrap.shorten(reason, 160, placeholder=" …"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    out = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
    if len(rows) == 1:
        out = ["no serving change recorded (nothing released yet)"]
    elif older:
        out.insert(1, f"… {older} older change(s) not shown (--limit {limit or len(entries)})")
    return out + [f"note: {n}" for n in result.notes]


__all__ = [
    "KINDS",
    "History",
    "HistoryEntry",
    "LogRead",
    "history",
    "lines",
    "read_entries",
    "read_recent",
    "read_store_log",
    "rotate_log",
    "summarize_log",
    "version_label",
    "who_label",
]
