"""``seqcls status``: what should be served, what each endpoint serves, what MLflow says — do they agree?

One answer to the operator's question, per model: the recorded state (serving, previous kept
warm, candidate in flight), every endpoint's READY versions of the five models, the MLflow
``champion``/``candidate`` aliases with their fingerprints, and the release lease holder. Each
disagreement is a sentence naming the fix; exit 0 when there is none, 1 otherwise. So is damage:
a served/previous/candidate version whose files are missing or changed, an unreadable or lost
state file, an unreadable lease — reported for that model, every other model still answered.
"""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from seqcls.contract.names import ModelName
from seqcls.errors import SeqclsError, ServingError
from seqcls.ops.disk import DiskUse, disk_use
from seqcls.ops.sync import (
    models_in,
    operator_models,
    release_command,
    store_problems,
    verdict_problems,
    version_problems,
)
from seqcls.registry.ledger import CANDIDATE, CHAMPION, aliased_version, client, find_version, version_label
from seqcls.release import control, verdicts
from seqcls.release.keys import served_release_key
from seqcls.serving.client import endpoints_from_settings
from seqcls.serving.lease import ReleaseLease
from seqcls.serving.reconcile import desired_versions
from seqcls.serving.repository import Repository, ServingOptions
from seqcls.serving.state import ServingState, current_state, state_damaged, state_path
from seqcls.settings import Settings
from seqcls.spec import ServingSpec

log = logging.getLogger(__name__)


@dataclass
class ModelStatus:
    model_name: ModelName
    recorded: dict[str, Any]
    endpoints: dict[str, Any]
    registry: dict[str, Any]
    lease: dict[str, Any] | None
    problems: list[str] = field(default_factory=list)
    #: Bytes on disk by kind (:class:`~seqcls.ops.gc.DiskUse`): what ``seqcls gc`` keeps bounded.
    disk: dict[str, int] = field(default_factory=dict)

    @property
    def agree(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "agree": self.agree}

    def lines(self) -> list[str]:
        r, reg = self.recorded, self.registry
        mlflow = {int(k): v for k, v in (reg.get("versions") or {}).items()}

        def named(triton: int | None) -> str:
            return version_label(triton, mlflow.get(triton)) if triton is not None else "none"

        out = [
            f"{self.model_name}: serving {named(r['serving'])}"
            + (" through the direct pipeline" if r.get("pipeline") == "direct" else "")
            + (f", fingerprint {str(r['fingerprint'])[:16]}" if r["fingerprint"] else "")
            + f"; previous {named(r['previous'])}; candidate {named(r['candidate'])}"
        ]
        if r.get("spec"):
            out.append(f"  serving spec: {ServingSpec.from_dict(r['spec']).describe()}")
        out += [f"  went live under an override of {o}" for o in r.get("overrides") or []]
        names = self.model_name.names if self.endpoints else None
        for ep, seen in self.endpoints.items():
            if isinstance(seen, str):
                out.append(f"  {ep}: {seen}")
            elif names is not None:
                out.append(
                    f"  {ep}: Triton versions READY — {names.ensemble} {seen[names.ensemble]}, candidate route "
                    f"{seen[names.candidate]}, composing {seen[names.tokenizer]}"
                )
        if "error" in reg:
            out.append(f"  MLflow: {reg['error']}")
        else:
            champion = reg.get("champion")
            fp = f", fingerprint {str(reg.get('champion_fingerprint'))[:16]}" if champion is not None else ""
            out.append(
                f"  MLflow: champion {_aliased(champion, reg.get('champion_triton'))}{fp}; alias candidate "
                f"{_aliased(reg.get('candidate'), reg.get('candidate_triton'))}"
            )
        out.append(f"  lease: {self.lease['holder'] if self.lease else 'free'}")
        if self.disk:
            out.append(DiskUse(**self.disk).line())
        out += [f"  ✗ {p}" for p in self.problems] or ["  ✓ served == recorded == champion"]
        return out


def _aliased(mlflow: int | None, triton: int | None) -> str:
    """An alias's version: "Triton v5 (MLflow v1)" when a Triton version holds it, else "MLflow v3"."""
    if mlflow is None:
        return "none"
    return version_label(triton, mlflow) if triton is not None else f"MLflow v{mlflow} (not loaded in Triton)"


def _registry(settings: Settings, model_name: str, repo: Repository, state: ServingState) -> dict[str, Any]:
    """Champion and candidate, ``expected`` (the version that stands for what is served) and ``versions``:
    the MLflow version of each Triton version the state names, so every number can be said both ways."""
    try:
        c = client(settings)
        champion, candidate = aliased_version(c, model_name, CHAMPION), aliased_version(c, model_name, CANDIDATE)
        versions: dict[int, int | None] = {}
        for v in dict.fromkeys(x for x in (state.serving, state.previous, state.candidate) if x is not None):
            mv = find_version(c, model_name, state.fingerprint_of(v), release_key=served_release_key(repo, v))
            versions[v] = int(mv.version) if mv is not None else None
    except Exception as exc:
        return {"error": f"unreachable or failing ({textwrap.shorten(str(exc), 200, placeholder=' …')})"}
    triton_of = {m: t for t, m in reversed(versions.items()) if m is not None}

    def held_by(mv) -> int | None:
        if mv is None:
            return None
        tagged = mv.tags.get("triton_version")
        return triton_of.get(int(mv.version)) or (int(tagged) if tagged and tagged.isdigit() else None)

    return {
        "champion": int(champion.version) if champion else None,
        "champion_fingerprint": champion.tags.get("fingerprint") if champion else None,
        "champion_release_key": champion.tags.get("release_key") if champion else None,
        "champion_triton": held_by(champion),
        "candidate": int(candidate.version) if candidate else None,
        "candidate_triton": triton_of.get(int(candidate.version)) if candidate else None,
        "expected": versions.get(state.serving) if state.serving is not None else None,
        "versions": {str(t): m for t, m in versions.items()},
    }


def _endpoint_problems(ep: str, seen: dict[str, list[int]] | str, want: dict[str, list[int]]) -> list[str]:
    if isinstance(seen, str):
        return [f"endpoint {ep} {seen}: start it, then run `seqcls sync` (the local server: `seqcls triton start` "
                "does both)"]  # fmt: skip
    wrong = [f"{m} {seen.get(m)} (recorded: {want[m]})" for m in want if seen.get(m) != want[m]]
    return [f"endpoint {ep} serves {'; '.join(wrong)}: run `seqcls sync`"] if wrong else []


def _state_problems(repo: Repository, state: ServingState) -> list[str]:
    """The state file itself: unreadable (a copy stands in) or lost (reconstructed)."""
    path, model = state_path(repo.root, repo.model_name), repo.model_name
    damaged = state_damaged(repo.root, model)
    if damaged:
        damaged = textwrap.shorten(damaged, 160, placeholder=" …")
        return [
            f"{path} is unreadable ({damaged}); its newest readable copy ({state.describe()}) stands in: "
            f"`seqcls sync --model-name {model}` records it again"
        ]
    if not path.exists() and state.serving is not None:
        return [
            f"{path} is missing; reconstructed from the state log or the served configs ({state.describe()}): "
            f"`seqcls sync --model-name {model}` records it again"
        ]
    if not path.exists() and repo.complete_versions():
        return [
            f"{path} is missing and nothing says which of the published versions {repo.complete_versions()} "
            f"{model!r} serves; `seqcls sync --model-name {model}` changes nothing until one is released again"
        ]
    return []


def _served_info(repo: Repository, version: int | None) -> dict[str, Any]:
    """The served version's ``release.json`` ({} when unknown or unreadable: the integrity problems say so)."""
    try:
        return (repo.release_info(version) if version is not None else None) or {}
    except ValueError:
        return {}


def _spec(info: dict[str, Any]) -> dict[str, Any] | None:
    """How the served version is served (its :class:`~seqcls.spec.ServingSpec`), as published; None: unknown.
    A version published before the spec was recorded: read back from its rendered serving options."""
    if not info:
        return None
    if isinstance(info.get("spec"), dict):
        return info["spec"]
    options = info.get("serving") or {}
    layout = f"{options.get('model_instances', 1)}x{options.get('intra_op_threads', 2)}"
    try:
        return ServingSpec(
            profile=str(info.get("profile") or "fp32"),
            runtime=options.get("runtime", "python-onnxruntime"),
            pipeline=options.get("pipeline", "ensemble"),
            device=options.get("device", "cpu"),
            layout=layout if options.get("device", "cpu") == "cpu" else None,
            metrics=bool(options.get("metrics", True)),
        ).to_dict()
    except SeqclsError:
        return None


def model_status(settings: Settings, model_name: ModelName) -> ModelStatus:
    repo = Repository.from_settings(settings, model_name)
    state: ServingState = current_state(repo.root, model_name)
    fp = state.fingerprint_of(state.serving)
    want = desired_versions(
        state,
        keep_previous=ServingOptions.keep_previous_loaded,
        direct=repo.direct_versions((state.serving, state.candidate, state.previous)),
    )
    endpoints = control.observe_all(endpoints_from_settings(settings), model_name)
    lease = ReleaseLease(repo.root, model_name)
    try:
        holder = lease.holder()
        lease_problem = None
    except ServingError as exc:  # an unreadable lease record: say so and how to break it
        holder, lease_problem = None, str(exc)
    dead = lease.dead_reason(holder) if holder else None
    info = _served_info(repo, state.serving)
    spec = _spec(info)
    recorded = {
        "serving": state.serving,
        "previous": state.previous,
        "candidate": state.candidate,
        "fingerprint": fp,
        "generation": state.generation,
        "spec": spec,
        "overrides": verdicts.overrides_of(info),
        "pipeline": spec.get("pipeline") if spec else None,
    }
    status = ModelStatus(
        model_name,
        recorded,
        endpoints,
        _registry(settings, model_name, repo, state),
        {"holder": holder.describe(), "dead": dead} if holder else None,
    )
    try:
        status.disk = disk_use(settings, model_name).to_dict()
    except OSError as exc:  # disk use is information, never a disagreement
        log.warning("status %s: disk use not measured (%s)", model_name, exc)
    status.problems += _state_problems(repo, state) + version_problems(repo, state) + store_problems(repo, state)
    status.problems += verdict_problems(repo, state)
    if lease_problem:
        status.lease = {"holder": "unreadable", "dead": lease_problem}
        status.problems.append(lease_problem)
    for ep, seen in endpoints.items():
        status.problems += _endpoint_problems(ep, seen, want)
    reg = status.registry
    if "error" in reg:
        status.problems.append(f"MLflow {reg['error']}: cannot tell whether champion agrees")
    elif state.serving is not None and reg.get("expected") is None:
        status.problems.append(
            f"no MLflow version of {model_name!r} holds the served Triton v{state.serving} (fingerprint "
            f"{str(fp)[:16]}, serving configuration {served_release_key(repo, state.serving)}): release it again "
            f"({release_command(repo, state.serving)})"
        )
    elif state.serving is not None and reg.get("champion") != reg.get("expected"):
        champion_fp = str(reg.get("champion_fingerprint"))[:16]
        status.problems.append(
            f"MLflow champion is {_aliased(reg.get('champion'), reg.get('champion_triton'))} (fingerprint "
            f"{champion_fp}), but {version_label(state.serving, reg.get('expected'))} (fingerprint "
            f"{str(fp)[:16]}) is served: run `seqcls sync`"
        )
    if state.candidate is not None and not lease_problem and (holder is None or dead):
        status.problems.append(
            f"candidate Triton v{state.candidate} has no live release ({dead or 'no lease holder'}): "
            "`seqcls sync` abandons it"
        )
    return status


def _failed(model_name: str, exc: Exception) -> ModelStatus:
    """The status of a model that could not be read at all (one model's damage is its own)."""
    recorded = {"serving": None, "previous": None, "candidate": None, "fingerprint": None, "generation": None}
    problem = str(exc) if isinstance(exc, SeqclsError) else f"{type(exc).__name__}: {exc}"
    lease = {"holder": "not read", "dead": None}
    return ModelStatus(model_name, recorded, {}, {"error": "not asked"}, lease, [problem[:1000]])


def status(settings: Settings, model_names: Sequence[str] | None = None) -> list[ModelStatus]:
    names = operator_models(model_names) or models_in(Path(str(settings.triton_repository)))
    out = []
    for name in names:
        try:
            out.append(model_status(settings, name))
        except Exception as exc:
            log.warning("status %s failed: %s", name, exc, exc_info=not isinstance(exc, SeqclsError))
            out.append(_failed(name, exc))
    return out
