"""``seqcls monitor``: live label shares vs the release's reference (statistics, windows, replicas, CLI).

Fakes only: Triton's ``/metrics`` and Prometheus' query API are loopback HTTP servers serving text
written by hand after ``seqcls_contract``'s names; the served version is a recorded state plus a
``release.json``. The real-Triton end-to-end run (steady vs shifted stream) lives with the serving tests.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

from seqcls.cli import main
from seqcls.contract import shipped
from seqcls.contract.names import ModelName
from seqcls.errors import InputError, ServingError
from seqcls.monitoring import drift, live
from seqcls.monitoring.drift import Counts, Thresholds, compare
from seqcls.monitoring.reference import Reference
from seqcls.serving import metrics
from seqcls.serving.repository import Repository
from seqcls.serving.state import ServingState, write_state
from seqcls.settings import ENV_PROMETHEUS_URL, Settings

C = shipped.contract()
BOUNDS = [float(b) for b in C.CONFIDENCE_BUCKETS]
#: Reference top-confidence texts per bucket (14 bounds + the +Inf bucket): most of it confident.
REF_CELLS = [10, 10, 10, 10, 10, 20, 20, 20, 30, 40, 60, 80, 150, 230, 300]
REF_LABELS = {"a": 300, "b": 200, "c": 100, "d": 50, "e": 10}
REFERENCE = Reference(
    source="eval_set",
    texts=1000,
    labels=REF_LABELS,
    unlabeled=400,
    near_threshold=dict.fromkeys(REF_LABELS, 0),
    confidence_buckets=BOUNDS,
    confidence_counts=list(np.cumsum(REF_CELLS).tolist()),
)
MODEL = ModelName("seqcls")


def cumulative(cells: list[int]) -> dict[float, int]:
    return dict(zip([*BOUNDS, math.inf], np.cumsum(cells).tolist(), strict=True))


def steady(k: int = 2) -> Counts:
    """Exactly the reference's shares, ``k`` times the texts."""
    return Counts(
        1000 * k, {lbl: n * k for lbl, n in REF_LABELS.items()}, 400 * k, cumulative([c * k for c in REF_CELLS])
    )


def shifted() -> Counts:
    """Label a mostly gone, e five times as frequent, confidence mass moved down."""
    labels = {"a": 100, "b": 400, "c": 200, "d": 100, "e": 300}
    return Counts(2000, labels, 900, cumulative([c * 2 for c in reversed(REF_CELLS)]))


def exposition(counts: dict[int, Counts], model: str = MODEL) -> str:
    """Triton's /metrics text for ``counts`` per version (the serving models' series, plus noise)."""
    lines = [
        "# HELP nv_inference_count Number of inferences performed",
        "# TYPE nv_inference_count counter",
        f'nv_inference_count{{model="{model}",version="1"}} 12',
        f"# TYPE {C.METRIC_TEXTS} counter",
    ]
    for v, c in counts.items():
        base = f'model="{model}",version="{v}"'
        lines.append(f"{C.METRIC_TEXTS}{{{base}}} {c.texts}")
        lines.append(f"{C.METRIC_UNLABELED}{{{base}}} {c.unlabeled}")
        lines += [f'{C.METRIC_LABEL_PREDICTIONS}{{{base},label="{lbl}"}} {n}' for lbl, n in c.labels.items()]
        for le, n in sorted(c.confidence.items()):
            bound = "+Inf" if math.isinf(le) else repr(le)
            lines.append(f'{C.METRIC_TOP_CONFIDENCE}_bucket{{{base},le="{bound}"}} {n}')
        lines.append(f"{C.METRIC_TOP_CONFIDENCE}_count{{{base}}} {c.texts}")
    lines.append(f'{C.METRIC_TEXTS}{{model="other",version="3"}} 99999')
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _no_prometheus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PROMETHEUS_URL, raising=False)
    monkeypatch.delenv("SEQCLS_TRITON_METRICS", raising=False)


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[str], tuple[int, str]]], str]]:
    """Start a loopback HTTP server answering ``respond(path) -> (status, body)``; returns host:port."""
    servers = []

    def start(respond: Callable[[str], tuple[int, str]]) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = respond(self.path)
                data = body.encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


class Replica:
    """A fake Triton metrics port whose counters the test sets."""

    def __init__(self, serve: Callable, counts: dict[int, Counts]) -> None:
        self.counts = counts
        self.endpoint = serve(lambda path: (200, exposition(self.counts)) if path == "/metrics" else (404, ""))


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def publish(settings: Settings, version: int = 3, *, reference: Reference | None = REFERENCE, **extra: object) -> None:
    """Record ``version`` as served, with a release.json carrying ``reference`` (and ``extra`` keys)."""
    repo = Repository.from_settings(settings, MODEL)
    vdir = repo.root / repo.names.ensemble / str(version)
    vdir.mkdir(parents=True)
    info = {"model_name": MODEL, "version": version, **extra}
    if reference is not None:
        info[C.REFERENCE_KEY] = reference.to_dict()
    (vdir / "release.json").write_text(json.dumps(info), encoding="utf-8")
    state = ServingState.empty(MODEL).with_candidate(version, "fp", "test").promoted(version, "fp", "test")
    write_state(repo.root, state, expected_generation=0)


def settings_for(*endpoints: str) -> Settings:
    return Settings.from_env(triton_metrics=tuple(endpoints))


# ----------------------------------------------------------------------------- statistics


def test_steady_traffic_is_no_drift_and_shifted_names_the_labels() -> None:
    calm = compare(REFERENCE, steady())
    assert calm.state == drift.NO_DRIFT and calm.drifted == [] and calm.summary() == "no drift"
    assert all(d.psi < 1e-9 and d.status == drift.STEADY for d in calm.labels)
    assert calm.confidence is not None and not calm.confidence.drifted
    moved = compare(REFERENCE, shifted())
    assert moved.state == drift.DRIFT
    assert [d.label for d in moved.drifted] == ["a", "e"]  # largest PSI first; b, c, d kept their shares
    a = next(d for d in moved.labels if d.label == "a")
    assert (a.reference_share, a.live_share, a.live_count) == (0.3, 0.05, 100)
    assert moved.unlabeled.live_share == 0.45 and moved.confidence is not None and moved.confidence.drifted
    assert moved.label_mix_psi > calm.label_mix_psi
    json.dumps(moved.to_dict(), allow_nan=False)  # strict JSON (the +Inf bucket is a string)


@pytest.mark.parametrize("seed", range(5))
def test_sampled_traffic_from_the_reference_rarely_alarms_a_shift_does(seed: int) -> None:
    """Sampling noise of 2,000 texts against a 1,000-text reference is not drift; a real shift is."""
    rng = np.random.default_rng(seed)
    shares = {lbl: n / 1000 for lbl, n in REF_LABELS.items()}
    labels = {lbl: int(rng.binomial(2000, p)) for lbl, p in shares.items()}
    cells = rng.multinomial(2000, np.array(REF_CELLS) / 1000).tolist()
    sample = Counts(2000, labels, int(rng.binomial(2000, 0.4)), cumulative(cells))
    assert compare(REFERENCE, sample).state == drift.NO_DRIFT
    moved = dict(labels, c=int(rng.binomial(2000, 0.25)))  # 10% → 25%: PSI ≈ 0.16
    assert [d.label for d in compare(REFERENCE, Counts(2000, moved, sample.unlabeled, sample.confidence)).drifted] == [
        "c"
    ]


def test_too_little_traffic_is_its_own_answer_never_no_drift() -> None:
    few = Counts(57, {"a": 50}, 0, {})
    report = compare(REFERENCE, few)
    assert report.state == drift.NOT_ENOUGH and not report.drift_found
    assert report.summary() == "not enough traffic: 57 texts, need 200"
    assert all(d.status == drift.TOO_RARE for d in report.labels)
    assert compare(REFERENCE, few, Thresholds(min_texts=50)).state == drift.DRIFT


def test_a_label_too_rare_to_judge_is_not_called_drifted() -> None:
    ref = Reference("golden", 1000, {"x": 1, "y": 500}, 0, {}, BOUNDS, [])
    report = compare(ref, Counts(300, {"x": 2, "y": 150}, 0, {}))  # x: 0.3 expected, 2 seen
    x = next(d for d in report.labels if d.label == "x")
    assert x.status == drift.TOO_RARE and report.state == drift.NO_DRIFT
    assert report.confidence is None  # no live histogram to compare


def test_labels_beyond_the_series_cap_are_compared_as_other() -> None:
    assert drift.reference_series(REFERENCE, ["a", "b"]) == {"a": 300, "b": 200, C.OTHER_LABEL: 160}
    live_counts = Counts(2000, {"a": 600, "b": 400, C.OTHER_LABEL: 900}, 800, {})
    report = compare(REFERENCE, live_counts, metric_labels=["a", "b"])
    assert [d.label for d in report.drifted] == [C.OTHER_LABEL]
    assert {d.label for d in report.labels} == {"a", "b", C.OTHER_LABEL}


def test_a_small_reference_is_said() -> None:
    ref = Reference("golden", 20, {"a": 10}, 10, {}, BOUNDS, [])
    report = compare(ref, Counts(400, {"a": 200}, 200, {}))
    assert report.state == drift.NO_DRIFT and "only 20 texts" in report.notes[0]


def test_statistics_match_known_values() -> None:
    assert drift.chi2_sf(3.841, 1) == pytest.approx(0.05, abs=1e-3)
    assert drift.chi2_sf(5.991, 2) == pytest.approx(0.05, abs=1e-3)
    assert drift.chi2_sf(18.307, 10) == pytest.approx(0.05, abs=3e-3)  # Wilson-Hilferty
    assert drift.two_proportion_p(50, 100, 50, 100) == 1.0
    assert drift.two_proportion_p(0, 100, 0, 100) == 1.0
    assert drift.two_proportion_p(60, 100, 40, 100) == pytest.approx(0.0047, abs=2e-4)  # z = 2.83
    assert drift.binary_psi(0.3, 0.3) == 0.0 and math.isfinite(drift.binary_psi(0.2, 0.0))


@pytest.mark.parametrize("kwargs", [{"psi": 0}, {"alpha": 1.5}, {"min_texts": 0}])
def test_bad_thresholds_name_the_value(kwargs: dict) -> None:
    with pytest.raises(InputError, match=str(next(iter(kwargs.values())))):
        Thresholds(**kwargs)


def test_counts_survive_a_snapshot_round_trip() -> None:
    c = shifted()
    assert Counts.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert steady(3).minus(steady(1)) == steady(2) and not steady(3).reset_since(steady(1))
    assert steady(1).reset_since(steady(2))


# ----------------------------------------------------------------------------- reading Triton


def test_samples_of_one_model_per_version() -> None:
    text = (
        exposition({3: steady(1), 2: Counts(5, {"a": 5}, 0, {})}) + 'seqcls_texts_total{model="seqcls",version="x"} 1\n'
    )
    counts = live.counts_from_samples(metrics.parse(text), MODEL)
    assert counts == {3: steady(1), 2: Counts(5, {"a": 5}, 0, {})}


@pytest.mark.parametrize(("text", "seconds"), [("30m", 1800), ("1h", 3600), ("2d", 172800), (" 1.5H", 5400)])
def test_since_accepts_units(text: str, seconds: int) -> None:
    assert live.parse_since(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["1", "h", "-1h", "0m", "1y"])
def test_since_refuses_the_rest(text: str) -> None:
    with pytest.raises(InputError, match="30m, 1h"):
        live.parse_since(text)


def test_two_replicas_are_summed_and_a_down_one_is_named(serve) -> None:
    r1, r2 = Replica(serve, {3: steady(1)}), Replica(serve, {3: steady(1), 2: Counts(40, {"a": 40}, 0, {})})
    down = closed_port()
    settings = settings_for(r1.endpoint, r2.endpoint, down)
    publish(settings)
    report = live.monitor(settings, MODEL)
    assert report.texts == 2000 and report.state == drift.NO_DRIFT and report.version == 3
    assert report.other_versions == {2: 40}
    assert report.replicas[r1.endpoint] == "ok" and "unreachable" in report.replicas[down]
    assert any(down in note for note in report.notes)
    assert report.window["basis"] == "since_load"
    assert report.headline().startswith("seqcls Triton v3: 2,000 texts since each replica loaded it; no drift")


def test_no_replica_answering_is_an_error(serve) -> None:
    settings = settings_for(closed_port())
    publish(settings)
    with pytest.raises(ServingError, match="no Triton replica's metrics could be read"):
        live.monitor(settings, MODEL)


def test_a_version_without_reference_says_re_release(serve) -> None:
    settings = settings_for(Replica(serve, {3: steady()}).endpoint)
    publish(settings, reference=None)
    with pytest.raises(ServingError, match=r"no reference recorded for seqcls Triton v3 .*re-release it"):
        live.monitor(settings, MODEL)


def test_an_empty_reference_is_refused(serve) -> None:
    settings = settings_for(Replica(serve, {3: steady()}).endpoint)
    publish(settings, reference=Reference("golden", 0, {}, 0, {}, BOUNDS, [0] * 15))
    with pytest.raises(ServingError, match="counts no texts"):
        live.monitor(settings, MODEL)


def test_metric_labels_of_the_release_are_used(serve) -> None:
    counts = Counts(2000, {"a": 600, "b": 400, C.OTHER_LABEL: 320}, 800, {})
    settings = settings_for(Replica(serve, {3: counts}).endpoint)
    publish(settings, **{C.METRIC_LABELS_KEY: ["a", "b"]})
    report = live.monitor(settings, MODEL)
    assert report.state == drift.NO_DRIFT and {d.label for d in report.labels} == {"a", "b", C.OTHER_LABEL}


# ----------------------------------------------------------------------------- windows by snapshot


def _old_reading(settings: Settings, age: float, replicas: dict) -> None:
    store = live.SnapshotStore.for_model(settings, MODEL)
    store.path.parent.mkdir(parents=True, exist_ok=True)
    with store.path.open("a", encoding="utf-8") as fh:
        fh.write(live.Reading(time.time() - age, replicas).to_json() + "\n")


def test_since_without_an_old_reading_counts_since_load_and_records_one(serve) -> None:
    replica = Replica(serve, {3: steady(1)})
    settings = settings_for(replica.endpoint)
    publish(settings)
    report = live.monitor(settings, MODEL, since="1h")
    assert report.window["basis"] == "since_load" and "no reading 1h old yet" in report.window["text"]
    assert any("counted since the version was loaded" in n for n in report.notes)
    readings = live.SnapshotStore.for_model(settings, MODEL).load()
    assert len(readings) == 1 and readings[0].total(3) == steady(1)


def test_since_is_the_difference_to_the_newest_reading_old_enough(serve) -> None:
    replica = Replica(serve, {3: shifted().plus(steady(3))})
    settings = settings_for(replica.endpoint)
    publish(settings)
    _old_reading(settings, 7200, {replica.endpoint: {3: steady(2)}})
    _old_reading(settings, 3700, {replica.endpoint: {3: steady(3)}})  # the newest at or before now-1h
    _old_reading(settings, 60, {replica.endpoint: {3: shifted()}})  # too recent
    report = live.monitor(settings, MODEL, since="1h")
    assert report.window["basis"] == "snapshot" and report.texts == 2000 and report.state == drift.DRIFT
    assert report.window["text"].startswith("since ") and "(1h 1m ago)" in report.window["text"]


def test_a_reset_counts_from_the_restart_and_says_so(serve) -> None:
    r1, r2 = Replica(serve, {3: steady(1)}), Replica(serve, {3: steady(3)})
    settings = settings_for(r1.endpoint, r2.endpoint)
    publish(settings)
    _old_reading(settings, 4000, {r1.endpoint: {3: steady(2)}, r2.endpoint: {3: steady(2)}})
    report = live.monitor(settings, MODEL, since=timedelta(hours=1))
    assert report.texts == 1000 + 1000  # r1 reloaded: all of its 1,000; r2: 3,000 - 2,000
    assert [n for n in report.notes if "restarted" in n] and r1.endpoint in report.notes[0]


def test_a_version_loaded_after_the_reading_counts_since_its_load(serve) -> None:
    replica = Replica(serve, {3: steady(1)})
    settings = settings_for(replica.endpoint)
    publish(settings)
    _old_reading(settings, 4000, {replica.endpoint: {2: steady(5)}})
    report = live.monitor(settings, MODEL, since="1h")
    assert report.texts == 1000 and any("counted since it was loaded" in n for n in report.notes)


def test_old_readings_are_thinned_and_dropped() -> None:
    now = 100 * 86400.0
    readings = [live.Reading(now - age, {"r": {}}) for age in (40 * 86400, 3 * 86400, 3 * 86400 - 60, 7200, 3600)]
    kept = live.thinned(readings, now)
    assert [now - r.at for r in kept] == [3 * 86400, 7200, 3600]


def test_a_damaged_snapshot_line_is_skipped(serve, caplog) -> None:
    replica = Replica(serve, {3: steady(1)})
    settings = settings_for(replica.endpoint)
    publish(settings)
    _old_reading(settings, 4000, {replica.endpoint: {3: Counts()}})
    with live.SnapshotStore.for_model(settings, MODEL).path.open("a") as fh:
        fh.write("{not json\n")
    assert live.monitor(settings, MODEL, since="1h").window["basis"] == "snapshot"
    assert "is not a reading" in caplog.text


# ----------------------------------------------------------------------------- Prometheus


def test_prometheus_answers_windows(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []
    counts = shifted()

    def respond(path: str) -> tuple[int, str]:
        query = parse_qs(urlsplit(path).query)["query"][0]
        asked.append(query)
        if C.METRIC_LABEL_PREDICTIONS in query:
            rows = [({"version": "3", "label": k}, v) for k, v in counts.labels.items()]
        elif "_bucket" in query:
            rows = [
                ({"version": "3", "le": "+Inf" if math.isinf(le) else str(le)}, n)
                for le, n in counts.confidence.items()
            ]
        elif C.METRIC_UNLABELED in query:
            rows = [({"version": "3"}, counts.unlabeled)]
        else:
            rows = [({"version": "3"}, counts.texts), ({"version": "4"}, 12.4)]
        result = [{"metric": m, "value": [time.time(), f"{v:.3f}"]} for m, v in rows]
        return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})

    url = f"http://{serve(respond)}"
    monkeypatch.setenv(ENV_PROMETHEUS_URL, url)
    settings = settings_for(closed_port())  # not scraped: Prometheus did
    publish(settings)
    report = live.monitor(settings, MODEL, since="2h")
    assert report.window["basis"] == "prometheus" and report.texts == 2000 and report.state == drift.DRIFT
    assert report.other_versions == {4: 12}
    assert all('model="seqcls"' in q and "[7200s]" in q for q in asked) and len(asked) == 4


def test_prometheus_refusing_is_an_error(serve) -> None:
    url = f"http://{serve(lambda path: (200, json.dumps({'status': 'error', 'error': 'parse error'})))}"
    settings = settings_for(closed_port())
    publish(settings)
    with pytest.raises(ServingError, match="parse error"):
        live.monitor(settings, MODEL, since="1h", prometheus=url)


# ----------------------------------------------------------------------------- CLI


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["monitor", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_steady_is_exit_0(serve, capsys) -> None:
    replica = Replica(serve, {3: steady()})
    publish(settings_for(replica.endpoint))
    code, out, _ = run(capsys, "--model-name", MODEL, "--metrics", replica.endpoint)
    assert code == 0 and out.splitlines() == ["seqcls Triton v3: 2,000 texts since each replica loaded it; no drift"]


def test_cli_shifted_is_exit_1_with_a_table(serve, capsys) -> None:
    replica = Replica(serve, {3: shifted()})
    publish(settings_for(replica.endpoint))
    code, out, _ = run(capsys, "--metrics", replica.endpoint, "--since", "30m")
    lines = out.splitlines()
    assert code == 1 and lines[0].endswith("; 2 labels drifted, top confidence drifted")
    assert lines[1].split() == ["label", "reference", "live", "PSI", "p"]
    rows = {line.split()[0]: line.split() for line in lines[2:] if not line.strip().startswith(("note", "top"))}
    assert rows["a"][1:3] == ["30.0%", "5.0%"] and "e" in rows
    assert any(line.strip().startswith("top confidence: PSI") for line in lines)
    assert any("no reading of seqcls" in line for line in lines)


def test_cli_json(serve, capsys) -> None:
    replica = Replica(serve, {3: shifted()})
    publish(settings_for(replica.endpoint))
    code, out, _ = run(capsys, "--metrics", replica.endpoint, "--json", "--psi", "0.5")
    data = json.loads(out)
    assert code == 1 and data["state"] == "drift" and data["version"] == 3 and data["thresholds"]["psi"] == 0.5
    assert set(data["drifted"]) <= {"a", "e", "(no label)"} and "a" in data["drifted"]


def test_cli_not_enough_traffic_is_exit_3(serve, capsys) -> None:
    replica = Replica(serve, {3: Counts(57, {"a": 20}, 37, {})})
    publish(settings_for(replica.endpoint))
    code, out, _ = run(capsys, "--metrics", replica.endpoint)
    assert code == 3 and out.splitlines()[0].endswith("; not enough traffic: 57 texts, need 200")
    assert run(capsys, "--metrics", replica.endpoint, "--min-texts", "50")[0] == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--since", "soon"], "--since 'soon'"),
        (["--alpha", "2"], "alpha 2.0"),
        (["--model-name", "../x"], "'../x'"),
    ],
)
def test_cli_bad_input_is_exit_2(serve, capsys, argv: list[str], message: str) -> None:
    replica = Replica(serve, {3: steady()})
    publish(settings_for(replica.endpoint))
    code, out, err = run(capsys, "--metrics", replica.endpoint, *argv)
    assert code == 2 and out == "" and message in err


def test_cli_unreachable_or_no_reference_is_exit_2(serve, capsys) -> None:
    publish(settings_for(closed_port()), reference=None)
    code, _, err = run(capsys, "--metrics", closed_port())
    assert code == 2 and "no reference recorded for seqcls Triton v3" in err
