"""What a release serves, by one name: its serving configuration, the release key, ``release.json``'s values.

The release key (16 hex of the serving configuration) names a release wherever it appears: in
every Triton version's ``release.json`` (publish writes it, :func:`served_release_key` reads it
back), in the release lease's owner (:func:`seqcls.release.control.release_owner`) and on the MLflow
run and model version (:mod:`seqcls.registry`) — so it lives here, below both serving and the
registry, and neither depends on the other for it.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any

from seqcls.config import SPEC_PARAMS
from seqcls.contract import shipped
from seqcls.errors import InputError
from seqcls.monitoring import reference as monitoring_reference
from seqcls.release.records import REFERENCE, Expected, effective_profile, model_inputs, serving_tokenizer
from seqcls.release.workspace import Release
from seqcls.serving.repository import Repository, ServingOptions
from seqcls.spec import host_refusal

#: Release parameters that change what is served or how its decision is made: in :func:`release_key`.
SERVING_PARAMS = ("profile", "opset", "max_length", "threshold", "thresholds", "hierarchy")
#: The quality gate's parameters (the eval set and its rules): whether a model may go live, not what it answers.
QUALITY_PARAMS = (
    "eval_set",
    "min_micro_f1",
    "min_macro_f1",
    "max_f1_drop",
    "max_f1_drop_relative",
    "max_level_f1_drop",
    "max_label_f1_drop",
    "min_eval_texts",
    "min_label_support",
    "max_profile_f1_drop",
)
#: The rules the gates judge by (besides the eval set and the tolerances already among the run's params):
#: recorded as MLflow params ``rule.<name>``, so a loosened rule is visible where the verdict is.
RULE_PARAMS = (
    "min_decision_agreement",
    "near_margin",
    "gpu_tolerance_factor",
    *(k for k in QUALITY_PARAMS if k != "eval_set"),
)
#: The serving spec's deployment fields (how Triton runs the release, not what it answers): in publish's
#: content key, not in the release key — the same registry version, another Triton version.
DEPLOYMENT_PARAMS = SPEC_PARAMS
#: Release parameters that only decide whether (and where) the parity gate passes: not in it.
GATE_ONLY_PARAMS = (
    "atol",
    "rtol",
    "prob_atol",
    "near_margin",
    "gpu_tolerance_factor",
    "provider",
    "require_gpu",
    "min_decision_agreement",
    "allow_unsafe_pickle",
    "override",
    "override_reason",
    "expected_clients",  # how profile auto measures its candidates: its choice is convert's record, not the key
    *QUALITY_PARAMS,
)


def serving_config(release: Release) -> dict[str, Any]:
    """What one registry version stands for: the checkpoint and how it is served and decided.

    In: ``fingerprint`` (weights, config, vocabulary, tokenizer files, label file — so the labels
    and their order), ``profile`` and ``opset`` (which ONNX graph answers: fp32, fused, int8 — or ``auto``,
    as configured: the same checkpoint released with ``auto`` again re-uses convert's choice),
    ``max_length`` (tokenizer truncation), ``hierarchy`` (a child implies its parent) and
    ``thresholds``: ``threshold`` + the per-label overrides resolved to one float32 value per label,
    the vector the served ``release.json`` holds (equivalent spellings give the same key).

    Out: ``model_name`` (it names the registered model; versions are looked up inside it); the
    gate's tolerances and where it runs (:data:`GATE_ONLY_PARAMS`): they decide whether a model may
    be released, not what it answers — re-gating the same model more strictly reuses its version;
    the Triton deployment options (tokenizer implementation, runtime, batching: publish's content
    key) and package versions (lineage tags): the same registry version, another Triton version.
    """
    cfg, ckpt = release.config, release.checkpoint
    try:
        vector = shipped.decide(release.settings).threshold_vector(list(ckpt.labels), cfg.threshold, cfg.thresholds)
    except ValueError as exc:
        operators = Path(str(ckpt.origin)) / ckpt.label_file.name  # named as the operator knows it, not the copy
        raise InputError(_unknown_labels(ckpt.labels, cfg.thresholds, operators) or f"thresholds: {exc}") from exc
    return {
        "fingerprint": ckpt.fingerprint,
        "profile": cfg.profile,  # as configured: "auto" names the release (its choice is re-used, not re-keyed)
        "opset": cfg.opset,
        "max_length": cfg.max_length,
        "hierarchy": cfg.hierarchy,
        "thresholds": {label: float32(t) for label, t in zip(ckpt.labels, vector, strict=True)},
    }


def _unknown_labels(labels: tuple[str, ...], per_label: dict[str, float], label_file: object) -> str | None:
    """``thresholds`` naming labels the checkpoint does not have: each, with the closest label if any."""
    unknown = [name for name in per_label if name not in labels]
    if not unknown:
        return None
    said = []
    for name in unknown:
        close = difflib.get_close_matches(name, labels, n=1, cutoff=0.6)
        said.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    shown = ", ".join(labels[:8]) + (f", … ({len(labels)} in all)" if len(labels) > 8 else "")
    return (
        f"thresholds: {', '.join(said)} {'is not a label' if len(unknown) == 1 else 'are not labels'} of this "
        f"checkpoint ({label_file}: {shown}); fix the label or drop it from thresholds"
    )


def float32(value: float) -> float:
    """A threshold as served (float32), written in the fewest digits that round-trip (0.7, not 0.699999988)."""
    import numpy as np

    return float(str(np.float32(value)))


def key_of(config: dict[str, Any]) -> str:
    """The release key of a :func:`serving_config` (also of the JSON in a version's ``serving_config`` tag)."""
    text = json.dumps(config, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def release_key(release: Release) -> str:
    """Short stable digest (16 hex) of :func:`serving_config`: one registry version per value.

    Needs only the checkpoint and the config (no workspace), so it can be asked before validate.
    """
    return key_of(serving_config(release))


def release_values(release: Release, options: ServingOptions) -> dict[str, Any]:
    """What every Triton version's ``release.json`` holds besides its files (the pyfunc carries it too)."""
    expected = Expected.load(release.workspace)
    configured, profile = release.config.profile, effective_profile(release)
    refusal = host_refusal(profile, device=options.device, runtime=options.runtime)
    if refusal:  # fp16 rendered for CPU serving, bf16 on the native backend: refused before any file or version
        raise InputError(refusal)
    tokenizer = serving_tokenizer(release)
    contract = shipped.contract()
    reference = monitoring_reference.load(release.workspace.path(REFERENCE))
    monitored = {}
    if reference is not None:  # the baseline of `seqcls monitor` and the labels with their own metric series
        monitored = {
            contract.REFERENCE_KEY: reference.to_dict(),
            contract.METRIC_LABELS_KEY: monitoring_reference.metric_labels(expected.labels, reference),
        }
    return {
        "model_name": str(release.config.model_name),  # a plain string: MLflow writes these as YAML too
        "fingerprint": release.checkpoint.fingerprint,
        "framework": release.checkpoint.framework,
        contract.MODEL_INPUTS_KEY: model_inputs(release.workspace),  # what the tokenizer emits, the graph takes
        "tokenizer_file": tokenizer.file.name,
        "labels": expected.labels,
        "thresholds": expected.thresholds,
        "hierarchy": expected.hierarchy,
        "max_length": release.config.max_length,
        "do_lower_case": release.checkpoint.do_lower_case,
        "pad_id": tokenizer.pad_id,
        "profile": profile,  # the graph served (a champion is re-scored as this profile)
        **({"profile_configured": configured} if configured != profile else {}),
        "release_key": release_key(release),  # the MLflow version's key: sync/status find it by this
        "spec": {**release.serving.to_dict(), "profile": profile},  # the serving spec, as resolved: status shows it
        contract.MAX_TEXT_BYTES_KEY: int(options.max_text_bytes),
        **monitored,
    }


def served_release_key(repo: Repository, version: int | None) -> str | None:
    """The registry key (fingerprint + serving configuration) Triton version ``version`` was published
    with; None for versions published before release keys (the registry then matches by fingerprint)."""
    info = repo.release_info(version) if version is not None else None
    key = (info or {}).get("release_key")
    return key if isinstance(key, str) else None
