"""``profile: auto``: measure every serving profile on this host, check it against fp32, serve the fastest that passes.

The chooser is tested with fake measurements (which candidate wins, which is rejected and why); one
real release of the tiny checkpoint runs convert → validate → evaluate with ``profile: auto`` and checks
that the choice is recorded and that both gates judged the chosen concrete profile.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from seqcls.config import ReleaseConfig
from seqcls.errors import InputError, StepOrderError
from seqcls.gates.metrics import score
from seqcls.profiles.auto import AUTO, CANDIDATES, Rules, Trial, choose
from seqcls.release.intake import open_release
from seqcls.release.records import effective_profile
from seqcls.spec import PROFILES

LABELS = ["a", "a##x", "b"]
THRESHOLDS = np.full(len(LABELS), 0.5, dtype=np.float32)
TEXTS = [f"text {i}" for i in range(40)]
GOLD = [["a", "a##x"] if i % 2 else ["b"] for i in range(len(TEXTS))]
RULES = Rules(min_decision_agreement=0.995, max_profile_f1_drop=0.005, near_margin=1e-3, hierarchy=True)


def _probs(flip: int = 0) -> np.ndarray:
    """Confident probabilities giving GOLD; ``flip`` texts get label ``b`` switched."""
    p = np.array([[0.9, 0.9, 0.1] if i % 2 else [0.1, 0.1, 0.9] for i in range(len(TEXTS))], dtype=np.float32)
    for i in range(flip):
        p[i, 2] = 1.0 - p[i, 2]
    return p


def _scores(wrong: int = 0):
    pred = [list(g) for g in GOLD]
    for i in range(wrong):
        pred[i] = ["b"] if "a" in pred[i] else ["a", "a##x"]
    return score(GOLD, pred, LABELS)


def _trial(profile: str, ms: float, *, flip: int = 0, wrong: int | None = 0, error: str | None = None) -> Trial:
    if error is not None:
        return Trial(profile, None, error=error)
    return Trial(
        profile,
        Path(f"{profile}.onnx"),
        latencies=[ms / 1000.0] * len(TEXTS),
        probabilities=_probs(flip),
        scores=None if wrong is None else _scores(wrong),
    )


def _choose(*trials: Trial, rules: Rules = RULES):
    return choose(list(trials), TEXTS, LABELS, THRESHOLDS, rules)


def test_the_fastest_candidate_that_passes_is_served() -> None:
    choice = _choose(_trial("fp32", 10), _trial("fp32-fused", 8), _trial("int8", 4))
    assert choice.chosen == "int8"
    by = {c.profile: c for c in choice.candidates}
    assert all(c.passed for c in by.values()) and not choice.rejected
    assert by["int8"].sentences_per_s == pytest.approx(250.0) and by["int8"].p50_ms == pytest.approx(4.0)
    assert by["int8"].agreement == 1.0 and by["int8"].micro_f1_drop == 0.0
    assert "int8" in choice.line() and "fastest" in choice.line()


def test_a_faster_candidate_that_moves_decisions_is_rejected_with_its_agreement() -> None:
    choice = _choose(_trial("fp32", 10), _trial("fp32-fused", 8), _trial("int8", 4, flip=3))
    assert choice.chosen == "fp32-fused"
    (rejected,) = choice.rejected
    assert rejected.profile == "int8" and not rejected.passed
    assert rejected.agreement == pytest.approx(1 - 3 / (len(TEXTS) * len(LABELS)))
    assert "decision agreement" in rejected.reason and "0.995" in rejected.reason


def test_a_faster_candidate_that_loses_f1_on_the_eval_set_is_rejected() -> None:
    choice = _choose(_trial("fp32", 10), _trial("fp32-fused", 8), _trial("int8", 4, wrong=2))
    assert choice.chosen == "fp32-fused"
    (rejected,) = choice.rejected
    assert rejected.profile == "int8" and rejected.agreement == 1.0  # agreement alone is not accuracy
    assert "max_profile_f1_drop" in rejected.reason and rejected.micro_f1_drop > 0.005


def test_without_an_eval_set_only_agreement_is_checked_and_said() -> None:
    choice = _choose(_trial("fp32", 10, wrong=None), _trial("int8", 4, wrong=None))
    assert choice.chosen == "int8" and choice.candidates[1].micro_f1_drop is None
    assert any("no eval set" in note for note in choice.notes)


def test_fp32_is_served_when_nothing_faster_passes() -> None:
    choice = _choose(
        _trial("fp32", 10), _trial("fp32-fused", 8, error="optimize: fusion failed"), _trial("int8", 4, flip=6)
    )
    assert choice.chosen == "fp32"
    reasons = {c.profile: c.reason for c in choice.rejected}
    assert set(reasons) == {"fp32-fused", "int8"}
    assert "fusion failed" in reasons["fp32-fused"] and "agreement" in reasons["int8"]
    assert json.loads(json.dumps(choice.to_dict()))["chosen"] == "fp32"


def test_a_slower_candidate_loses_even_when_it_passes() -> None:
    choice = _choose(_trial("fp32", 4), _trial("fp32-fused", 5), _trial("int8", 6))
    assert choice.chosen == "fp32" and not choice.rejected
    assert [line.split()[0] for line in choice.table()[2:]] == ["fp32", "fp32-fused", "int8"]


def test_a_lead_within_noise_does_not_give_up_exactness() -> None:
    """int8 3 % faster than fp32 on a shared host is noise: the exact graph is served, and the note says why."""
    choice = _choose(_trial("fp32", 10), _trial("fp32-fused", 9.9), _trial("int8", 9.7))
    assert choice.chosen == "fp32" and not choice.rejected
    assert any("within" in note and "int8" in note and "5%" in note for note in choice.notes), choice.notes
    assert "no faster graph leads by ≥5%" in choice.line()
    assert _choose(_trial("fp32", 10), _trial("int8", 9.0)).chosen == "int8"  # 11 % is a lead


def test_auto_is_a_profile_everywhere_and_an_unknown_one_still_fails_clearly() -> None:
    assert AUTO in PROFILES and set(CANDIDATES) == set(PROFILES) - {AUTO}
    assert ReleaseConfig(profile="auto").profile == "auto"
    with pytest.raises(InputError, match="profile must be one of fp32, fp32-fused, int8, bf16, fp16, auto, got 'bf17'"):
        ReleaseConfig(profile="bf17")


def test_effective_profile_is_the_configured_one_or_converts_choice(tiny_checkpoint: Path) -> None:
    assert effective_profile(open_release(tiny_checkpoint, ReleaseConfig(profile="int8"))) == "int8"
    with pytest.raises(StepOrderError):  # auto: known only once convert chose
        effective_profile(open_release(tiny_checkpoint, ReleaseConfig(profile="auto")))


@pytest.mark.slow
def test_auto_release_chooses_measures_and_gates_the_chosen_profile(tiny_checkpoint: Path, tmp_path: Path) -> None:
    from seqcls.steps import run_release

    eval_set = tmp_path / "eval.jsonl"
    rows = [
        ("某科技公司宣布裁员百分之十。", ["组织关系", "组织关系##裁员"]),
        ("球队在决赛中夺冠。", ["体育", "体育##夺冠"]),
        ("初创企业完成新一轮融资。", ["财经", "财经##融资"]),
        ("知名主持人加盟新的电视台。", ["组织关系", "组织关系##加盟"]),
    ] * 13  # 52 texts: at least the 50 a quality verdict is taken on
    eval_set.write_text(
        "".join(json.dumps({"text": t, "labels": ls}, ensure_ascii=False) + "\n" for t, ls in rows), encoding="utf-8"
    )
    release = open_release(tiny_checkpoint, ReleaseConfig(profile="auto", eval_set=str(eval_set), expected_clients=4))
    results = run_release(release, until="evaluate")
    assert [r.step for r in results][-3:] == ["convert", "validate", "evaluate"]
    ws = release.workspace
    choice = json.loads(ws.path("onnx/profile_choice.json").read_text(encoding="utf-8"))
    assert [c["profile"] for c in choice["candidates"]] == list(CANDIDATES)
    for c in choice["candidates"]:
        assert c["error"] is not None or (c["sentences_per_s"] > 0 and c["p50_ms"] > 0 and c["texts"] > 0), c
        if c["error"] is None:  # warmed, timed until steady (or said not), at the release's expected clients
            assert c["warm_lengths"] > 1 and c["clients"] == 4 and c["single_sentences_per_s"] > 0, c
            assert 2 <= len(c["passes_sentences_per_s"]) <= 4 and 2 <= len(c["concurrent_passes_sentences_per_s"]) <= 4
            assert c["sentences_per_s"] in c["concurrent_passes_sentences_per_s"][1:], c  # a timed pass, not the first
    assert choice["clients"] == 4
    fp16 = next(c for c in choice["candidates"] if c["profile"] == "fp16")  # no CUDA here: rejected, saying why
    assert "CUDAExecutionProvider only" in fp16["error"], fp16
    chosen = effective_profile(release)
    assert chosen == choice["chosen"] and chosen in CANDIDATES
    assert choice["eval_texts"] > 0 and choice["golden_texts"] > 0 and choice["texts"] <= 200
    summary = ws.step("convert")["summary"]
    assert summary["profile_choice"]["chosen"] == chosen
    assert ("served_file" in summary) == (chosen != "fp32")
    assert not list(ws.path("onnx").glob("*candidate*")), "rejected candidates are not kept"
    report = json.loads(ws.path("parity/report.json").read_text(encoding="utf-8"))
    exact = chosen in ("fp32", "fp32-fused")
    assert report["profile"] == chosen and report["numeric"]["gating"] is exact
    expected = json.loads(ws.path("parity/expected.json").read_text(encoding="utf-8"))
    assert expected["gate"] == ("exact" if exact else "agreement")
    evaluation = json.loads(ws.path("quality/evaluation.json").read_text(encoding="utf-8"))
    assert evaluation["profile"] == chosen and (evaluation["fp32"] is None) == (chosen == "fp32")
    again = run_release(release, until="convert")  # the same release reuses its choice
    assert again[-1].status == "skipped" and effective_profile(release) == chosen

    from seqcls.registry import ledger as registry

    version = run_release(release, until="register")[-1].summary["version"]
    c = registry.client(release.settings)
    mv = c.get_model_version("seqcls", str(version))
    assert (mv.tags["profile"], mv.tags["profile_chosen"]) == ("auto", chosen)  # identity and what is served
    params = c.get_run(mv.run_id).data.params
    assert (params["profile"], params["profile_chosen"]) == ("auto", chosen)


# ----------------------------------------------------------------------------- warm before timing


class _ColdPerLength:
    """A session that, like OpenVINO, pays a first-time cost per new sequence length, and a smaller one on
    its second run of a length; from the third on it runs at its steady cost (seconds)."""

    def __init__(self, cold: float = 0.03, second: float = 0.012, steady: float = 0.003, labels: int = 3) -> None:
        self.costs, self.labels, self.seen = (cold, second, steady), labels, {}
        self.steady_cost = steady
        self.batches: list[int] = []  # the rows of every run, in order

    def get_inputs(self):
        from types import SimpleNamespace

        return [SimpleNamespace(name=n) for n in ("input_ids", "token_type_ids")]

    def get_session_options(self):
        from types import SimpleNamespace

        return SimpleNamespace(intra_op_num_threads=2)

    def run(self, output_names, feed):
        import time

        ids = feed["input_ids"]
        self.batches.append(ids.shape[0])
        k = self.seen.get(ids.shape, 0)
        self.seen[ids.shape] = k + 1
        time.sleep(self.costs[min(k, 2)])
        return [np.zeros((ids.shape[0], self.labels), dtype=np.float32)]


def _answering(tmp_path: Path):
    from seqcls.contract import shipped
    from seqcls.profiles.auto import Answering

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "一"]) + "\n", encoding="utf-8")
    tok = shipped.text().build_tokenizer(vocab, max_length=128)
    return Answering(tok, 0, LABELS, THRESHOLDS, True, ["CPUExecutionProvider"])


def test_auto_records_the_warm_rate_not_a_cold_first_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph paying a first-time cost per length (OpenVINO) was timed after 5 warm-up texts, so texts
    of every other length were timed cold: the rate recorded was the cold first pass's."""
    from seqcls.profiles import auto

    sessions = {name: _ColdPerLength() for name in ("fp32", "bf16")}
    monkeypatch.setattr(auto.runtime, "session", lambda path, providers, profile: sessions[profile])
    golden = ["一" * (1 + i % 20) for i in range(40)]  # 20 lengths, each twice
    trials = [Trial(p, tmp_path / f"{p}.onnx") for p in sessions]
    choice = auto.measure_and_choose(trials, golden, None, _answering(tmp_path), RULES)
    steady_rate = 1.0 / sessions["fp32"].steady_cost
    for c in choice.candidates:
        # sleep overshoots a little: the warm rate is just under the steady cost's, never 3x under it
        assert 0.75 * steady_rate < c.single_sentences_per_s <= steady_rate, (c.profile, c, steady_rate)
        assert c.warm_lengths == 20, c
        first, *_, last = c.passes_sentences_per_s  # the curve: the second run of each length was still slow
        assert len(c.passes_sentences_per_s) >= 3 and first < 0.75 * last, c.passes_sentences_per_s
        assert c.clients == 8 and 0.75 * steady_rate < c.sentences_per_s <= steady_rate, c  # no equal lengths in 8
    assert choice.clients == 8 and "8 clients" in choice.line()
    assert any("→" in row for row in choice.table())


def test_steady_means_the_last_two_passes_within_five_percent() -> None:
    from seqcls.profiles.timing import steady

    assert not steady([100.0]) and not steady([89.6, 115.6]) and not steady([115.6, 123.6])
    assert steady([89.6, 115.6, 119.0]) and steady([100.0, 95.0])


def test_an_unsteady_curve_records_its_median_pass_after_the_first_not_its_last_sample() -> None:
    from seqcls.profiles.timing import recorded_pass

    assert recorded_pass([89.6, 115.6, 119.0], ok=True) == 2
    assert recorded_pass([197.4, 207.2, 206.8, 246.5], ok=False) == 1  # 207.2 of 207.2, 206.8, 246.5
    assert recorded_pass([1663.0, 2288.0, 1845.0, 901.0], ok=False) == 2  # 1845, not the last 901
    assert recorded_pass([50.0, 60.0], ok=False) == 1


def test_at_the_expected_concurrency_exact_graphs_merge_equal_lengths_and_the_others_run_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the served model does: 8 pending texts of one length are one run for fp32, eight for int8/bf16 —
    and the rate at the expected concurrency is what decides."""
    from seqcls.profiles import auto, timing

    sessions = {name: _ColdPerLength() for name in ("fp32", "int8", "bf16")}
    monkeypatch.setattr(auto.runtime, "session", lambda path, providers, profile: sessions[profile])
    golden = ["一" * (1 + i // 8) for i in range(32)]  # 4 lengths, 8 texts each, in order
    trials = [Trial(p, tmp_path / f"{p}.onnx") for p in sessions]
    choice = auto.measure_and_choose(trials, golden, None, _answering(tmp_path), RULES, clients=8)
    by = {c.profile: c for c in choice.candidates}
    # what ran (not how fast: the host's load moves the rates): fp32 merged 8 equal-length texts per run,
    # int8/bf16 ran every text alone
    assert max(sessions["fp32"].batches) == 8 and 8 in sessions["fp32"].batches[-4:], sessions["fp32"].batches
    assert all(set(sessions[p].batches) == {1} for p in ("int8", "bf16"))
    assert by["fp32"].sentences_per_s > 2 * by["fp32"].single_sentences_per_s  # one 3 ms run for 8 texts
    for p in ("int8", "bf16"):
        assert by[p].sentences_per_s < 1.5 * by[p].single_sentences_per_s, by[p]
    assert choice.chosen == "fp32"  # single texts tie; at 8 clients fp32 leads
    feeds = [{"input_ids": np.zeros((1, n)), "token_type_ids": np.zeros((1, n))} for n in (3, 3, 4, 3)]
    assert [r["input_ids"].shape for r in timing.runs_at(feeds, 2, merge=True)] == [(2, 3), (1, 4), (1, 3)]
    assert len(timing.runs_at(feeds, 4, merge=False)) == 4
    one = auto.measure_and_choose(
        [Trial("fp32", tmp_path / "fp32.onnx")], golden, None, _answering(tmp_path), RULES, clients=1
    )
    (c,) = one.candidates
    assert c.clients == 1 and c.sentences_per_s == c.single_sentences_per_s and "one text at a time" in one.line()


def test_expected_clients_is_a_release_parameter_with_a_range() -> None:
    """Per model (models file ``params``, the DAG's param, ``--expected-clients``), default 8, 1–256."""
    from seqcls.config import FIELD_BY_NAME
    from seqcls.profiles.timing import DEFAULT_CLIENTS

    assert ReleaseConfig().expected_clients == DEFAULT_CLIENTS == 8
    assert ReleaseConfig.from_dict({"expected_clients": 4}).expected_clients == 4
    assert FIELD_BY_NAME["expected_clients"].flag == "--expected-clients"
    with pytest.raises(InputError, match="expected_clients"):
        ReleaseConfig(expected_clients=0)


@pytest.mark.slow
def test_auto_warms_every_length_on_the_real_bf16_engine_before_timing_it(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real engine behind bf16 is timed only on lengths it has run before: OpenVINO may pay a first-time
    cost per new input length (on an AMD EPYC with AVX512-BF16, a length's first run of this tiny model took
    about 5 ms against a median warm run of about 0.6 ms; on a Xeon with AMX no such cost showed), so auto warms
    every length before timing anything — checked on the runs the engine was given, not on how fast they were."""
    import seqcls_engine

    from seqcls.profiles import auto
    from seqcls.steps import run_release
    from seqcls.steps.convert import answering

    if not set(seqcls_engine.cpu_flags()) & set(seqcls_engine.BF16_CPU_FLAGS):
        pytest.skip("this CPU has neither avx512_bf16 nor amx_bf16")
    release = open_release(tiny_checkpoint, ReleaseConfig(profile="bf16"))
    run_release(release, until="convert")
    texts = ["裁" * (1 + i // 2) for i in range(60)]  # 30 lengths, each twice in a row: untimed, a pass
    seen: list[tuple[int, bool]] = []  # (length, first time this length ran)
    real = auto.runtime.session

    def spied(*args, **kwargs):
        session = real(*args, **kwargs)
        run = session.run

        def spy(output, feed):
            width = int(next(iter(feed.values())).shape[-1])
            seen.append((width, all(w != width for w, _ in seen)))
            return run(output, feed)

        session.run = spy
        return session

    monkeypatch.setattr(auto.runtime, "session", spied)
    timings, _, _ = auto.time_requests(
        {"bf16": release.workspace.path("onnx/model.onnx")}, texts, answering(release), 4
    )
    t = timings["bf16"]
    assert t.warm_lengths == 30 and len(t.passes) >= 2 and t.concurrent and t.single
    firsts = [i for i, (_, first) in enumerate(seen) if first]
    # every length's first run came before any text ran twice: the warming, not a timed pass (which would
    # have run each length's first text, then its second, at positions 0, 2, 4, ...)
    assert firsts == list(range(30)), firsts
    assert len(t.latencies) == len(texts)


class _Cached:
    """A graph whose run is slow right after another graph ran: its weights had left the cache (a CPU whose
    last-level cache holds one model's weights, which a served model — the only one running — keeps)."""

    last: object = None

    def __init__(self, warm_s: float = 0.0005, cold_s: float = 0.01) -> None:
        self.warm_s, self.cold_s = warm_s, cold_s

    def get_inputs(self):
        return []

    def run(self, output, feed):
        cold = _Cached.last is not self
        _Cached.last = self
        time.sleep(self.cold_s if cold else self.warm_s)
        return [np.zeros((1, 2), np.float32)]


def test_timing_graphs_together_does_not_time_them_colder_than_served() -> None:
    """Timed beside other graphs, a graph is timed as it serves alone (within 10 %): graphs taking turns every
    few texts re-stream their weights from memory on every turn, which a served model does not."""
    from seqcls.profiles import timing

    feeds = [{"input_ids": np.zeros((1, 3 + i % 4), np.int64)} for i in range(60)]
    alone = timing.time_graphs({"int8": _Cached()}, {"int8": feeds}, "logits", clients=1)["int8"].single
    together = timing.time_graphs(
        {name: _Cached() for name in ("fp32", "int8", "bf16")}, {n: feeds for n in ("fp32", "int8", "bf16")},
        "logits", clients=1,
    )  # fmt: skip
    assert together["int8"].single >= 0.9 * alone, (together["int8"].single, alone)
