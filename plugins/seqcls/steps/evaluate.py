"""Step 4 — evaluate: the quality gate. A model no better than the one it replaces never goes live.

The parity gate proves the served graph computes what the checkpoint computes; it cannot tell a
good checkpoint from a bad retrain. This step scores the candidate's *serving* graph (the chosen
profile's ONNX, the serving tokenizer, the served decision rule: :mod:`seqcls.gates.scoring`) on
a labeled eval set, re-scores the model that is served now — the champion — from its published
Triton files on the same texts, and judges both with the release's quality rules
(:mod:`seqcls.gates.rules`): floors always, drops vs the champion when one is served (skipped,
and said so, for a first release), and for a reduced-precision profile the drop vs the fp32 graph.
Both models answered the same texts, so the drops vs the champion are judged as paired data
(:mod:`seqcls.gates.paired`): a drop over its threshold refuses only when it is significant at the
eval set's size, and the evidence says which checks the eval set is too small for.

The eval set is the operator's (``eval_set``: CLI ``--eval-set``, DAG param, models file
``params``); only when none is configured is the checkpoint's own ``test``/``dev`` file used, and
the report says so. No eval set at all: the gate is skipped with a warning (recorded as such).
It is read once and hashed; a changed file, champion or rule re-runs the step.

Writes ``quality/evaluation.json`` (what ``seqcls evaluate --json`` prints), ``bad_cases.tsv`` and
``labels.png``; the figures go to the release's MLflow run (``eval.*``, tag ``seqcls.gates``),
also when refused. A refusal raises :class:`GateError` naming each failed rule with both values;
nothing was registered or published, so what is served is unchanged.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.checkpoints.checkpoint import sha256_file
from seqcls.contract import runtime, shipped
from seqcls.errors import GateError, InputError, ServingError
from seqcls.gates.evalset import EvalSet
from seqcls.gates.metrics import Scores, bad_cases, score, write_bad_cases
from seqcls.gates.quality_plot import plot_labels
from seqcls.gates.rules import QualityRules, Verdict, judge, judged_labels, paired_test
from seqcls.gates.scoring import Graph, Predictions, decide_vector, predict
from seqcls.monitoring import reference as monitoring_reference
from seqcls.registry.ledger import version_artifacts
from seqcls.registry.runs import log_quality_evidence
from seqcls.release import verdicts
from seqcls.release.kept import OWN_EVAL_FILES, kept_eval_set
from seqcls.release.keys import QUALITY_PARAMS, served_release_key
from seqcls.release.records import (
    BAD_CASES,
    EVALUATION,
    OUT_DIRS,
    QUALITY_PLOT,
    REFERENCE,
    Expected,
    Shadow,
    effective_profile,
    fp32_onnx,
    profile_words,
    served_onnx,
    serving_tokenizer,
)
from seqcls.release.workspace import Release, StepResult
from seqcls.serving.published import champion_graph
from seqcls.serving.repository import Repository
from seqcls.serving.state import current_state
from seqcls.steps import record_refusal, require

log = logging.getLogger(__name__)

STEP = "evaluate"
OUT_DIR = OUT_DIRS[STEP]
#: Where the champion's verified copies are scored from (inside the workspace, removed afterwards).
SCRATCH = ".champion-"
#: Eval texts the smoke test also sends through the live candidate and public routes (the shadow comparison).
SHADOW_TEXTS = 64


def _champion(release: Release) -> tuple[Repository, int | None, dict[str, Any]]:
    """The repository, the version served now (None: nothing yet) and its ``release.json``."""
    repo = Repository.from_settings(release.settings, release.config.model_name)
    version = current_state(repo.root, release.config.model_name).serving
    info = repo.recorded(version, repo.names.ensemble) if version is not None else None  # its pin, else its own
    return repo, version, info or {}


def judged_eval_set(info: dict[str, Any]) -> str | None:
    """The sha256 of the eval set a published version was judged on (its verdicts; before verdicts were
    recorded: the reference its release counted on an eval set), None when it was judged on none."""
    quality = ((info.get(verdicts.VERDICTS_KEY) or {}).get("quality") or {}).get("judged") or {}
    if (quality.get("eval_set") or {}).get("sha256"):
        return quality["eval_set"]["sha256"]
    reference = info.get(shipped.contract().REFERENCE_KEY) or {}
    return reference.get("sha256") if reference.get("source") == "eval_set" else None


def gate_inputs(release: Release, es: EvalSet | None, champion: dict[str, Any] | None) -> dict[str, Any]:
    """Everything the verdict depends on: a change re-runs the gate."""
    cfg = release.config
    common = shipped.common_dir(release.settings)
    return {
        "eval_set": es.sha256 if es else None,
        "graph": release.workspace.require("convert")["outputs"],
        "rules": {k: getattr(cfg, k) for k in QUALITY_PARAMS if k != "eval_set"},
        "decision": {k: getattr(cfg, k) for k in ("threshold", "thresholds", "hierarchy", "max_length", "profile")},
        "champion": champion,
        "serving_code": {m: sha256_file(common / f"{m}.py") for m in shipped.MODULES},
        **verdicts.inputs(release, "quality"),
    }


def candidate_graphs(release: Release) -> list[Graph]:
    """The candidate's serving graph, and the fp32 graph beside it when the profile is another."""
    cfg, ckpt, ws = release.config, release.checkpoint, release.workspace
    profile = effective_profile(release)
    tok = serving_tokenizer(release)
    tokenizer = tok.build(shipped.text(release.settings), cfg.max_length)
    labels = list(ckpt.labels)
    try:
        thresholds = decide_vector(labels, cfg.threshold, cfg.thresholds)
    except ValueError as exc:
        raise InputError(f"thresholds: {exc}") from exc
    graphs = [Graph("candidate", served_onnx(ws), tokenizer, tok.pad_id, labels, thresholds, cfg.hierarchy, profile)]
    if profile != "fp32":
        graphs.append(Graph("fp32", fp32_onnx(ws), tokenizer, tok.pad_id, labels, thresholds, cfg.hierarchy, "fp32"))
    return graphs


def answer_all(
    release: Release, es: EvalSet, repo: Repository, champion_version: int | None
) -> tuple[dict[str, Predictions], dict[str, Any] | None]:
    """The eval set through the candidate's graph(s) and, when one is served, the champion's published version;
    and the override of the quality gate when the champion could not be re-scored (None otherwise)."""
    providers = runtime.choose_providers(release.config.provider, False)
    answers = {g.name: predict(g, es.texts, providers) for g in candidate_graphs(release)}
    if champion_version is not None:
        for stale in release.workspace.root.glob(f"{SCRATCH}*"):  # a killed run's copies (we hold the workspace lock)
            shutil.rmtree(stale, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix=SCRATCH, dir=release.workspace.root) as scratch:
            # its published files; damaged or gone: a verified copy (pin + workspace, else MLflow's artifacts)
            try:
                graph, source = champion_graph(repo, champion_version, Path(scratch) / "repository")
            except ServingError:
                fp = current_state(repo.root, repo.model_name).fingerprint_of(champion_version)
                key = served_release_key(repo, champion_version)
                mlflow = version_artifacts(release.settings, repo.model_name, fp, key, Path(scratch) / "mlflow")
                try:
                    graph, source = champion_graph(
                        repo, champion_version, Path(scratch) / "copy", [mlflow] if mlflow else []
                    )
                except ServingError as exc:
                    refused = GateError(
                        f"Quality gate cannot re-score the champion (Triton v{champion_version}) of "
                        f"{release.config.model_name!r}: {exc}. Nothing was registered or published. Restore it "
                        f"(`seqcls sync --model-name {release.config.model_name}`) if a copy turns up, or judge this "
                        'release without the champion comparison: --override quality --reason "…" (recorded in the '
                        "history)."
                    )
                    override = verdicts.override_for(release, "quality", refused)
                    if override is None:
                        raise refused from None
                    return answers, override  # recorded as the gate's override (history, MLflow, release.json)
            log.info("evaluate: champion Triton v%d scored from %s", champion_version, source)
            answers["champion"] = predict(graph, es.texts, providers)
    return answers, None


def shadow_sample(n: int, size: int = SHADOW_TEXTS) -> list[int]:
    """Indices of ``size`` texts spread evenly over the eval set (deterministic: a re-run sends the same)."""
    if n <= size:
        return list(range(n))
    return sorted({int(i * n / size) for i in range(size)})


def write_evidence(
    release: Release,
    es: EvalSet,
    answers: dict[str, Predictions],
    scores: dict[str, Scores],
    verdict: Verdict,
    champion_version: int | None,
    out: Path,
) -> dict[str, Any]:
    """``evaluation.json`` (what ``seqcls evaluate --json`` prints), ``bad_cases.tsv``, ``labels.png``."""
    cfg, cand, champ = release.config, answers["candidate"], answers.get("champion")
    pairs = list(zip(es.labels, cand.labels, strict=True))
    rows = bad_cases(
        es.texts, es.labels, cand.labels, [cand.confidences(i, [*g, *p]) for i, (g, p) in enumerate(pairs)]
    )
    write_bad_cases(out / Path(BAD_CASES).name, rows)
    disagree = None if champ is None else sum(set(a) != set(b) for a, b in zip(cand.labels, champ.labels, strict=True))
    evaluation = {
        "model_name": cfg.model_name,
        "fingerprint": release.checkpoint.fingerprint,
        "profile": effective_profile(release),
        "profile_configured": cfg.profile,
        "passed": verdict.passed,
        "summary": verdict.summary(),
        **{who: scores[who].to_dict() if who in scores else None for who in ("candidate", "champion", "fp32")},
        "champion_version": champion_version,
        "failures": [c.failure() for c in verdict.failures],
        "checks": [c.evidence() for c in verdict.checks],
        "skipped": verdict.skipped,
        "paired": verdict.paired,
        "too_small": [c.describe() for c in verdict.too_small],
        "eval_set": es.summary(),
        "champion_disagreements": disagree,
        "bad_cases": len(rows),
        "seconds": {name: p.seconds for name, p in answers.items()},
    }
    (out / Path(EVALUATION).name).write_text(json.dumps(evaluation, indent=1, ensure_ascii=False), encoding="utf-8")
    pick = shadow_sample(len(es.texts))
    Shadow(
        [es.texts[i] for i in pick],
        [cand.labels[i] for i in pick],
        [champ.labels[i] for i in pick] if champ is not None else None,
        champion_version,
    ).save(out)
    title = _title(release, champion_version)
    plot_labels(out / Path(QUALITY_PLOT).name, scores["candidate"], scores.get("champion"), title=title)
    return evaluation


def write_reference(release: Release, cand: Predictions, es: EvalSet, out: Path) -> None:
    """The release's reference distribution (what ``seqcls monitor`` compares live traffic with):
    the candidate's serving graph on the eval set, counted as the served postprocess counts."""
    cfg = release.config
    ref = monitoring_reference.compute(
        cand.probabilities,
        decide_vector(cand.model_labels, cfg.threshold, cfg.thresholds),
        cand.model_labels,
        hierarchy=cfg.hierarchy,
        source="eval_set",
        truncated=int(cand.extra.get("truncated", 0)),
        sha256=es.sha256,
        path=str(es.path),
    )
    monitoring_reference.save(ref, out / Path(REFERENCE).name)


def golden_reference(release: Release, out: Path) -> None:
    """Without an eval set, the reference is the golden texts' answers the parity gate validated."""
    expected = Expected.load(release.workspace)
    probs = np.array([item.probabilities for item in expected.items], dtype=np.float32)
    ref = monitoring_reference.compute(
        probs, expected.thresholds, expected.labels, hierarchy=expected.hierarchy, source="golden"
    )
    monitoring_reference.save(ref, out / Path(REFERENCE).name)


def run_gate(
    release: Release, es: EvalSet, repo: Repository, champion_version: int | None, out: Path
) -> tuple[dict, str]:
    """Score, judge, write the evidence; raise GateError (evidence kept in ``failed/evaluate/``) when refused."""
    t0 = time.perf_counter()
    champion = f"Triton v{champion_version}" if champion_version is not None else "none (first release)"
    log.info("evaluate: %d labeled texts from %s (%s), champion %s", len(es.texts), es.path, es.source, champion)
    answers, override = answer_all(release, es, repo, champion_version)
    labels = list(release.checkpoint.labels)
    scores = {name: score(es.labels, p.labels, labels) for name, p in answers.items()}
    rules = QualityRules.from_mapping(release.config.to_dict())
    paired = None
    if "champion" in answers:  # the same texts answered by both: judge the drops as paired data
        judged = judged_labels(scores["candidate"], scores["champion"], rules.min_label_support)
        paired = paired_test(es.labels, answers["candidate"].labels, answers["champion"].labels, labels, judged)
    verdict = judge(scores["candidate"], scores.get("champion"), rules, fp32=scores.get("fp32"), paired=paired)
    if verdict.too_small:
        log.warning("evaluate: %s", verdict.too_small_note())
    evaluation = write_evidence(release, es, answers, scores, verdict, champion_version, out)
    write_reference(release, answers["candidate"], es, out)
    if not verdict.passed:
        refused = GateError(refusal(release, es, champion_version, verdict.summary()))
        again = verdicts.override_for(release, "quality", refused)
        if again is None:
            raise refused
        override = again if override is None else {**override, "verdict": f"{override['verdict']}; {again['verdict']}"}
    c, ch = scores["candidate"], scores.get("champion")
    summary = {
        "passed": verdict.passed,
        **({"overridden": True, "override": override} if override else {}),
        "micro_f1": round(c.micro_f1, 4),
        "macro_f1": round(c.macro_f1, 4),
        "champion_version": champion_version,
        "champion_micro_f1": round(ch.micro_f1, 4) if ch else None,
        "champion_macro_f1": round(ch.macro_f1, 4) if ch else None,
        "champion_disagreements": evaluation["champion_disagreements"],
        "too_small": len(verdict.too_small),
        "eval_set": es.summary(),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    if override:
        return summary, f"OVERRIDDEN by {override['by']} ({override['reason']}): {override['verdict']}"
    vs = (
        f" vs champion {champion} {ch.micro_f1:.4f}/{ch.macro_f1:.4f} "
        f"({evaluation['champion_disagreements']} of {len(es.texts)} label sets differ)"
        if ch
        else " (first release: change rules skipped)"
    )
    note = verdict.too_small_note()
    return (
        summary,
        f"quality gate passed on {len(es.texts)} texts: micro/macro-F1 {c.micro_f1:.4f}/{c.macro_f1:.4f}{vs}"
        + (f"; {note}" if note else ""),
    )


def _title(release: Release, champion_version: int | None) -> str:
    cfg = release.config
    champion = f" vs champion Triton v{champion_version}" if champion_version is not None else ""
    profile = effective_profile(release)
    return f"{cfg.model_name} {release.checkpoint.short_fingerprint} ({profile}){champion}: F1 per label"


def refusal(release: Release, es: EvalSet, champion_version: int | None, why: str) -> str:
    cfg, ws = release.config, release.workspace
    champion = f"the served champion (Triton v{champion_version})" if champion_version is not None else "no champion"
    return (
        f"Quality gate refused model {cfg.model_name!r} (fingerprint {release.checkpoint.short_fingerprint}, profile "
        f"{profile_words(release)}) against {champion} on {es.path} ({len(es.texts)} texts, sha256 "
        f"{es.sha256[:12]}): {why}. "
        f"Nothing was registered or published; what is served is unchanged. Evidence: "
        f"{ws.failed_dir(STEP)}/evaluation.json, bad_cases.tsv, labels.png (and the MLflow run tagged "
        f"seqcls.gates=failed)."
    )


def _skip(release: Release, champion: dict[str, Any] | None, out: Path) -> tuple[dict, str]:
    why = (
        "no eval set: none configured (--eval-set / the eval_set param) and the checkpoint has none of "
        f"{', '.join(OWN_EVAL_FILES)} — the quality gate did not run"
    )
    override = None
    if champion and champion.get("eval_set"):  # the contract: a champion judged on an eval set sets the bar
        refused = GateError(
            f"Quality gate refused model {release.config.model_name!r} (fingerprint "
            f"{release.checkpoint.short_fingerprint}): the served champion (Triton v{champion['version']}) was judged "
            f"on an eval set (sha256 {champion['eval_set'][:12]}) and this release has none: {why}. Give it the eval "
            "set (--eval-set / the eval_set param / the models file's eval_set), or override the quality gate with "
            "a reason. Nothing was registered or published."
        )
        override = verdicts.override_for(release, "quality", refused)
        if override is None:
            raise refused
    log.warning("evaluate: %s", why)
    golden_reference(release, out)
    (out / "evaluation.json").write_text(json.dumps({"passed": True, "skipped": [why]}, indent=1), encoding="utf-8")
    summary = {"passed": True, "skipped": why, **({"overridden": True, "override": override} if override else {})}
    return summary, f"skipped — {why}"


def evaluate(release: Release) -> StepResult:
    """Run the quality gate (or skip it, saying why, when there is no eval set)."""
    require(release, STEP)
    ws = release.workspace
    es = kept_eval_set(release)
    repo, version, info = _champion(release)
    champion = {"version": version, "publish_key": info.get("publish_key")} if version is not None else None
    if es is None:
        judged = {**champion, "eval_set": judged_eval_set(info)} if champion else None
        inputs, body = gate_inputs(release, None, judged), lambda out: _skip(release, judged, out)
    else:
        inputs, body = gate_inputs(release, es, champion), lambda out: run_gate(release, es, repo, version, out)
    try:
        result = ws.run_step(STEP, inputs, body, out_dir=OUT_DIR)
    except GateError as exc:
        log_quality_evidence(release, "failed")
        record_refusal(release, "quality", exc)  # the serving log (`seqcls history`); never raises
        raise
    if result.status == "ok":
        override = result.summary.get("override")
        log_quality_evidence(release, "overridden" if override else "skipped" if es is None else "passed")
        if override:
            verdicts.record_override(release, override)  # the serving log (`seqcls history`); never raises
    return result
