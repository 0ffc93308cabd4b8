"""Step 2 — convert: static graph → ONNX with paddle2onnx, output renamed ``logits``, verified.

paddle2onnx has failure modes that look like success (it can log "ONNX model saved" and leave
an empty file; a missing params file silently exports a model without weights; its optimiser
tries to ``pip install`` at conversion time). So this step pins down its environment and then
checks the result itself: non-empty, ``onnx.checker`` full check, input names/dtypes/ranks, one
float output whose last dimension is the number of labels. A transformers checkpoint arrives here
already in ONNX (PyTorch's exporter, :mod:`seqcls.frameworks.transformers`): the same rename, checks and profiles.

``profile: auto`` builds every candidate profile from ``model.onnx`` here, lets
:mod:`seqcls.profiles.auto` time and check them on this host and keeps the fastest that passes as
``served.onnx`` (fp32: ``model.onnx`` itself); the choice and every candidate's figures are in
``onnx/profile_choice.json`` and the record's ``profile_choice`` (:func:`seqcls.release.records.effective_profile`).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from seqcls.checkpoints.checkpoint import read_model_config
from seqcls.checkpoints.golden import golden_texts
from seqcls.contract import runtime, shipped
from seqcls.errors import ConversionError
from seqcls.files import replace_file
from seqcls.frameworks import for_checkpoint
from seqcls.frameworks.paddle import static_model_files
from seqcls.gates.evalset import EvalSet
from seqcls.profiles.auto import CANDIDATES, CHOICE_FILE, Answering, Rules, Trial, measure_and_choose
from seqcls.profiles.calibration import Calibration
from seqcls.profiles.optimize import check_engine, optimize_onnx
from seqcls.release.kept import kept_eval_set
from seqcls.release.records import OUT_DIRS, serving_tokenizer, static_dir
from seqcls.release.workspace import Release, StepResult
from seqcls.settings import ENV_POLYGRAPHY_AUTOINSTALL, scoped_env
from seqcls.spec import AUTO_PROFILE, ENGINES
from seqcls.steps import require

log = logging.getLogger(__name__)

STEP = "convert"
OUT_DIR = OUT_DIRS[STEP]
MODEL_FILE = "model.onnx"
INPUT_NAMES: tuple[str, ...] = shipped.contract().MODEL_INPUTS  # paddle2onnx's graph
KNOWN_INPUTS: tuple[str, ...] = shipped.contract().MODEL_INPUT_NAMES
OUTPUT_NAME: str = shipped.contract().LOGITS_OUTPUT
SERVED_FILE = "served.onnx"  # the profile's optimised model (fp32-fused, int8); fp32 serves model.onnx
CANDIDATE_DIR = "candidates"  # profile auto's candidate graphs while they are measured (removed after)
#: What profile auto's choice depends on besides the graph: a change re-runs convert (and the choice).
AUTO_PARAMS = ("threshold", "thresholds", "hierarchy", "near_margin", "provider", "require_gpu", "max_profile_f1_drop")
#: …and the concurrency its candidates are timed at: a change chooses again.
AUTO_TIMING_PARAMS = ("expected_clients",)


def rename_output(model, new_name: str = OUTPUT_NAME) -> str:
    """Rename the single graph output (paddle2onnx calls it ``fetch_name_0``) everywhere it appears."""
    if len(model.graph.output) != 1:
        names = [o.name for o in model.graph.output]
        raise ConversionError(f"expected exactly one graph output (the logits), found {names}")
    old = model.graph.output[0].name
    if old == new_name:
        return old
    for node in model.graph.node:
        for i, name in enumerate(node.output):
            if name == old:
                node.output[i] = new_name
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new_name
    model.graph.output[0].name = new_name
    return old


def verify_onnx(path: Path, num_labels: int, input_names: tuple[str, ...] | list[str] = INPUT_NAMES) -> dict:
    """Check a converted model the way Triton and the parity gate will use it; raise on mismatch.

    ``input_names``: the id tensors the graph must take — exactly these, each from the serving
    contract (:data:`KNOWN_INPUTS`), since the tokenizer model produces only those."""
    import onnx

    if not path.is_file() or path.stat().st_size == 0:
        raise ConversionError(f"{path}: paddle2onnx produced no model (missing or empty file).")
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        raise ConversionError(f"{path}: onnx.checker rejected the model: {str(exc)[:500]}") from exc
    model = onnx.load(str(path), load_external_data=False)
    inputs = {i.name: i for i in model.graph.input}
    problems = []
    extra = sorted(set(inputs) - set(input_names))
    if extra:
        problems.append(
            f"unexpected inputs {extra} (the served tokenizer produces {list(input_names)}; "
            f"known: {list(KNOWN_INPUTS)})"
        )
    for name in input_names:
        if name not in inputs:
            problems.append(f"input {name!r} missing (inputs: {sorted(inputs)})")
            continue
        t = inputs[name].type.tensor_type
        if t.elem_type != onnx.TensorProto.INT64:
            problems.append(f"input {name!r} has dtype {onnx.TensorProto.DataType.Name(t.elem_type)}, expected INT64")
        if len(t.shape.dim) != 2:
            problems.append(f"input {name!r} has rank {len(t.shape.dim)}, expected 2 ([batch, seq])")
    outs = list(model.graph.output)
    if len(outs) != 1 or outs[0].name != OUTPUT_NAME:
        problems.append(f"expected one output named {OUTPUT_NAME!r}, found {[o.name for o in outs]}")
    else:
        t = outs[0].type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if t.elem_type != onnx.TensorProto.FLOAT:
            problems.append(f"output dtype {onnx.TensorProto.DataType.Name(t.elem_type)}, expected FLOAT")
        if len(dims) != 2 or dims[-1] != num_labels:
            problems.append(f"output shape {dims}, expected [batch, {num_labels}] (one logit per label)")
    if not model.graph.initializer:
        problems.append("the graph has no weights (initializers): was the params file missing?")
    if problems:
        raise ConversionError(f"{path}: " + "; ".join(problems))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return {
        "opset": opset,
        "inputs": [n for n in KNOWN_INPUTS if n in inputs],
        "output": OUTPUT_NAME,
        "initializers": len(model.graph.initializer),
        "nodes": len(model.graph.node),
    }


def convert_static(model_file: Path, params_file: Path, save_file: Path, *, opset: int, num_labels: int) -> dict:
    """paddle2onnx (Python API) + output rename + verification; returns the verification facts."""
    import onnx
    import paddle2onnx

    if not params_file.is_file() or params_file.stat().st_size == 0:
        # paddle2onnx would silently export a model without weights
        raise ConversionError(f"{params_file}: params file missing or empty; re-run `seqcls export`.")
    raw = save_file.with_name("raw.onnx")
    with scoped_env(ENV_POLYGRAPHY_AUTOINSTALL, "0"):  # polygraphy must not pip-install mid-conversion
        try:
            paddle2onnx.export(
                model_filename=str(model_file),
                params_filename=str(params_file),
                save_file=str(raw),
                opset_version=opset,
                auto_upgrade_opset=False,
                enable_onnx_checker=True,
                verbose=False,
            )
        except Exception as exc:
            raise ConversionError(f"paddle2onnx failed on {model_file} (opset {opset}): {str(exc)[:500]}") from exc
    if not raw.is_file() or raw.stat().st_size == 0:
        raise ConversionError(f"{raw}: paddle2onnx reported success but wrote an empty model (Paddle#69128).")
    model = onnx.load(str(raw))
    old = rename_output(model)
    onnx.save(model, str(save_file))
    raw.unlink()
    facts = verify_onnx(save_file, num_labels)
    facts["renamed_from"] = old
    return facts


def calibration(release: Release):
    """``int8``'s calibration set: the release's golden texts (validate's), tokenized by the
    tokenizer Triton serves (:func:`~seqcls.release.records.serving_tokenizer`: the checkpoint's
    ``vocab.txt`` rebuilt for PaddleNLP, the exported ``tokenizer.json`` for transformers) and
    padded with its pad id."""
    texts, source = golden_texts(release.checkpoint)
    cfg = release.config
    tok = serving_tokenizer(release)
    json_file = tok.kind == "tokenizer.json"
    return Calibration(
        tuple(texts),
        source,
        None if json_file else tok.file,
        tok.do_lower_case,
        cfg.max_length,
        tokenizer_file=tok.file if json_file else None,
        pad_id=tok.pad_id,
        threshold=cfg.threshold,
        min_agreement=cfg.min_decision_agreement,
        settings=release.settings,
    )


def attention_shape(release: Release) -> tuple[int, int]:
    """(attention heads, hidden size) from the snapshot's model config: what the fusions need."""
    config, _ = read_model_config(release.checkpoint.path)
    return int(config.get("num_attention_heads", 12)), int(config.get("hidden_size", 768))


def build_profile(release: Release, src: Path, dst: Path, profile: str, shape: tuple[int, int]) -> dict:
    """``profile``'s graph (fp32-fused, int8, fp16) for ``src`` at ``dst`` (int8 calibrated on the golden
    texts; fp16 checked on the parity gate's providers, so refused without CUDA); ``shape``: :func:`attention_shape`."""
    num_heads, hidden_size = shape
    cfg = release.config
    return optimize_onnx(
        src,
        dst,
        profile,
        num_heads=num_heads,
        hidden_size=hidden_size,
        calibration=calibration(release) if profile == "int8" else None,
        providers=runtime.choose_providers(cfg.provider, cfg.require_gpu),
    )


def answering(release: Release) -> Answering:
    """How the candidates are fed and decided: as served, on the parity gate's provider and threads."""
    cfg, ckpt = release.config, release.checkpoint
    tok = serving_tokenizer(release)
    labels = list(ckpt.labels)
    return Answering(
        tok.build(shipped.text(release.settings), cfg.max_length),
        tok.pad_id,
        labels,
        shipped.decide(release.settings).threshold_vector(labels, cfg.threshold, cfg.thresholds),
        cfg.hierarchy,
        runtime.choose_providers(cfg.provider, cfg.require_gpu),
    )


def build_candidates(release: Release, out: Path, inputs: list[str]) -> tuple[list[Trial], dict[str, dict]]:
    """Every candidate profile's graph under ``out/candidates`` (fp32: ``model.onnx``); a candidate whose
    build fails (fusion off tolerance, int8 below its agreement target) is a rejected trial, not an error."""
    trials, reports, shape = [Trial("fp32", out / MODEL_FILE)], {}, attention_shape(release)
    for profile in CANDIDATES[1:]:
        dst, t0 = out / CANDIDATE_DIR / f"{profile}.onnx", time.perf_counter()
        log.info("convert: auto — building candidate %s", profile)
        try:
            if profile in ENGINES:  # bf16: fp32's graph on another engine, nothing to build
                reports[profile], dst = check_engine(out / MODEL_FILE, profile), out / MODEL_FILE
            else:
                reports[profile] = build_profile(release, out / MODEL_FILE, dst, profile, shape)
                verify_onnx(dst, release.checkpoint.num_labels, inputs)
            trials.append(Trial(profile, dst, build_seconds=time.perf_counter() - t0))
        except ConversionError as exc:
            log.warning("convert: auto — candidate %s not built: %s", profile, exc)
            trials.append(Trial(profile, None, build_seconds=time.perf_counter() - t0, error=str(exc)[:500]))
    return trials, reports


def auto_profile(release: Release, out: Path, facts: dict[str, Any], es: EvalSet | None) -> str:
    """``profile: auto``: build, time and check every candidate; serve the fastest that passes.

    Writes ``profile_choice.json``; the chosen graph becomes ``served.onnx`` (fp32 serves ``model.onnx``)
    and its facts go where a configured profile's go (``optimize``, ``served_file``)."""
    cfg = release.config
    trials, reports = build_candidates(release, out, facts["inputs"])
    rules = Rules(cfg.min_decision_agreement, cfg.max_profile_f1_drop, cfg.near_margin, cfg.hierarchy)
    golden, _ = golden_texts(release.checkpoint)
    choice = measure_and_choose(trials, golden, es, answering(release), rules, clients=cfg.expected_clients)
    if choice.chosen in ENGINES:  # bf16 serves model.onnx on its engine
        facts["optimize"] = reports[choice.chosen]
    elif choice.chosen != "fp32":
        replace_file(out / CANDIDATE_DIR / f"{choice.chosen}.onnx", out / SERVED_FILE)
        facts["optimize"] = reports[choice.chosen]
        facts["served_file"] = f"{OUT_DIR}/{SERVED_FILE}"
    shutil.rmtree(out / CANDIDATE_DIR, ignore_errors=True)  # the rejected and slower graphs are not served
    (out / CHOICE_FILE).write_text(json.dumps(choice.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
    facts["profile_choice"] = choice.summary()
    facts["profile_choice_file"] = f"{OUT_DIR}/{CHOICE_FILE}"
    return choice.line()


def adopt_exported(exported: Path, save_file: Path, *, num_labels: int, input_names: list[str]) -> dict:
    """A graph PyTorch exported (transformers path): output renamed ``logits`` if needed, verified."""
    import onnx

    model = onnx.load(str(exported))
    old = rename_output(model)
    onnx.save(model, str(save_file))
    facts = verify_onnx(save_file, num_labels, input_names)
    facts["renamed_from"] = old
    return facts


def convert(release: Release) -> StepResult:
    """Convert the exported static model to ``<workspace>/onnx/model.onnx``."""
    ws, cfg = release.workspace, release.config
    export_rec = require(release, STEP)["export"]
    exported = ws.require("export")["summary"]
    exported_onnx = for_checkpoint(release.checkpoint).exported_onnx(exported)
    if exported_onnx is None:  # a static graph: paddle2onnx converts it
        model_file, params_file = static_model_files(static_dir(ws))
    inputs = {
        "export_outputs": export_rec["outputs"],
        "opset": cfg.opset,
        "num_labels": release.checkpoint.num_labels,
        "output_name": OUTPUT_NAME,
        "profile": cfg.profile,
    }
    if cfg.profile in ("int8", AUTO_PROFILE):  # calibrated on the golden texts as serving tokenizes them
        inputs["calibration"] = {
            "golden": release.checkpoint.golden_sha256 or "builtin",
            **{k: getattr(cfg, k) for k in ("max_length", "threshold", "min_decision_agreement")},
        }
    es = None
    if cfg.profile == AUTO_PROFILE:  # the choice is measured on the golden and eval texts, judged by these
        es = kept_eval_set(release)
        inputs["auto"] = {
            "eval_set": es.sha256 if es else None,
            **{k: getattr(cfg, k) for k in AUTO_PARAMS + AUTO_TIMING_PARAMS},
        }

    def body(out: Path) -> tuple[dict, str]:
        if exported_onnx is not None:
            log.info("convert: verifying PyTorch's %s (opset %d) → %s", exported_onnx, cfg.opset, MODEL_FILE)
            facts = adopt_exported(
                ws.path(exported_onnx),
                out / MODEL_FILE,
                num_labels=release.checkpoint.num_labels,
                input_names=list(exported["inputs"]),
            )
        else:
            log.info("convert: paddle2onnx %s (opset %d) → %s", model_file.name, cfg.opset, MODEL_FILE)
            facts = convert_static(
                model_file, params_file, out / MODEL_FILE, opset=cfg.opset, num_labels=release.checkpoint.num_labels
            )
        facts["bytes"] = (out / MODEL_FILE).stat().st_size
        facts["model_file"] = f"{OUT_DIR}/{MODEL_FILE}"
        msg = (
            f"{MODEL_FILE} {facts['bytes'] / 1e6:.1f} MB, inputs {', '.join(facts['inputs'])}, "
            f"opset {facts['opset']}, output "
            f"{facts['renamed_from']!r} → {OUTPUT_NAME!r}, checker passed"
        )
        if cfg.profile == AUTO_PROFILE:
            msg += "; " + auto_profile(release, out, facts, es)
        elif cfg.profile in ENGINES:  # bf16: model.onnx served by its engine; checked to compile and run here
            log.info("convert: serving profile %s runs %s on %s", cfg.profile, MODEL_FILE, ENGINES[cfg.profile][0])
            facts["optimize"] = check_engine(out / MODEL_FILE, cfg.profile)
            msg += f"; profile {cfg.profile}: {MODEL_FILE} on {ENGINES[cfg.profile][0]} at {ENGINES[cfg.profile][1]}"
        elif cfg.profile != "fp32":
            log.info("convert: applying serving profile %s → %s", cfg.profile, SERVED_FILE)
            facts["optimize"] = build_profile(
                release, out / MODEL_FILE, out / SERVED_FILE, cfg.profile, attention_shape(release)
            )
            verify_onnx(out / SERVED_FILE, release.checkpoint.num_labels, facts["inputs"])
            facts["served_file"] = f"{OUT_DIR}/{SERVED_FILE}"
            msg += f"; profile {cfg.profile}: {SERVED_FILE} {(out / SERVED_FILE).stat().st_size / 1e6:.1f} MB"
        return facts, msg

    return ws.run_step(STEP, inputs, body, out_dir=OUT_DIR)
