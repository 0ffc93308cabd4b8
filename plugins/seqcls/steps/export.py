"""Step 1 — export: dygraph checkpoint → static graph (``paddle.jit.to_static`` + ``jit.save``).

Paddle 3 writes the PIR format (``float32.json`` + ``float32.pdiparams``); older exports are
``float32.pdmodel``. :func:`static_model_files` reads either, so convert/validate accept both.
A Hugging Face ``transformers`` checkpoint is exported by PyTorch straight to ONNX
(``static/model.onnx``, :mod:`seqcls.frameworks.transformers`) together with the ``tokenizer.json`` Triton will serve;
convert then verifies and optimises it like paddle2onnx's output.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from seqcls.errors import CheckpointError, ConversionError
from seqcls.records import OUT_DIRS
from seqcls.checkpoints.safeload import scan_pickle
from seqcls.serving import shipped
from seqcls.workspace import Release, StepResult

log = logging.getLogger(__name__)

STEP = "export"
OUT_DIR = OUT_DIRS[STEP]
PREFIX = "float32"


def static_model_files(directory: Path) -> tuple[Path, Path]:
    """``(model_file, params_file)`` of a static model: PIR ``.json`` preferred, ``.pdmodel`` accepted."""
    directory = Path(directory)
    for ext in (".json", ".pdmodel"):
        for model in sorted(directory.glob(f"*{ext}")):
            params = model.with_suffix(".pdiparams")
            if params.is_file():
                return model, params
    raise ConversionError(
        f"{directory}: no static model found (expected <name>.json or <name>.pdmodel next to "
        "<name>.pdiparams); run `seqcls export` first."
    )


def _load_dygraph(release: Release):
    import paddle
    from paddlenlp.transformers import AutoModelForSequenceClassification

    paddle.set_device("cpu")
    path = release.checkpoint.path
    if release.checkpoint.weights.suffix == ".pdparams":
        # again: the file may have changed since the checkpoint step
        scan_pickle(release.checkpoint.weights, allow_unsafe=release.config.allow_unsafe_pickle)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(str(path))
    except Exception as exc:  # paddlenlp raises many types for a broken checkpoint
        raise CheckpointError(
            f"{release.checkpoint.weights}: could not be loaded as a PaddleNLP sequence classifier "
            f"({type(exc).__name__}: {str(exc)[:300]})."
        ) from exc
    model.eval()
    verify_loaded(model, release.checkpoint.weights, allow_unsafe=release.config.allow_unsafe_pickle)
    n_params = sum(int(p.size) for p in model.parameters())
    return model, n_params


def _file_tensors(weights: Path, allow_unsafe: bool = False) -> dict:
    import numpy as np

    if weights.suffix == ".safetensors":
        from safetensors.numpy import load_file

        return load_file(str(weights))
    import paddle

    scan_pickle(weights, allow_unsafe=allow_unsafe)  # paddle.load unpickles
    state = paddle.load(str(weights), return_numpy=True)
    if not isinstance(state, dict):
        raise CheckpointError(f"{weights}: holds a {type(state).__name__}, not a state dict of tensors.")
    return {k: np.asarray(v) for k, v in state.items()}


def verify_loaded(model, weights: Path, *, allow_unsafe: bool = False) -> None:
    """Refuse a checkpoint whose tensors do not all match the model (keys, shapes, values).

    PaddleNLP's ``from_pretrained`` only *warns* about missing or unexpected weights and
    initialises the missing ones randomly — a release would then serve noise. Here that is an error.
    """
    import numpy as np

    prefix = f"{getattr(model, 'base_model_prefix', '')}."

    def norm(key: str) -> str:
        return key[len(prefix) :] if prefix != "." and key.startswith(prefix) else key

    try:
        stored = {norm(k): v for k, v in _file_tensors(weights, allow_unsafe).items()}
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{weights}: cannot be read as tensors ({type(exc).__name__}: {exc}).") from exc
    current = {norm(k): v for k, v in model.state_dict().items()}
    missing = sorted(set(current) - set(stored))
    unexpected = sorted(set(stored) - set(current))
    wrong_shape = sorted(k for k in set(current) & set(stored) if tuple(current[k].shape) != tuple(np.shape(stored[k])))
    if missing or unexpected or wrong_shape:

        def few(keys: list[str]) -> str:
            return ", ".join(keys[:3]) + (" ..." if len(keys) > 3 else "")

        raise CheckpointError(
            f"{weights}: does not match the model config.json describes — {len(missing)} parameters missing"
            f"{' (' + few(missing) + ')' if missing else ''}, {len(unexpected)} unexpected"
            f"{' (' + few(unexpected) + ')' if unexpected else ''}, {len(wrong_shape)} with another shape"
            f"{' (' + few(wrong_shape) + ')' if wrong_shape else ''}. PaddleNLP would initialise the missing "
            "ones randomly; release the checkpoint the training job saved, with its own config.json."
        )
    differ = [
        k
        for k in current
        if not np.array_equal(current[k].numpy(), np.asarray(stored[k]).astype(current[k].numpy().dtype))
    ]
    if differ:
        raise CheckpointError(f"{weights}: {len(differ)} tensors differ after loading (e.g. {differ[0]}).")


HF_ONNX = "model.onnx"


def export_transformers(release: Release) -> StepResult:
    """Export a transformers checkpoint to ``<workspace>/static/model.onnx`` + ``tokenizer.json``."""
    from seqcls.frameworks import transformers as hf
    hf.require_torch()
    ckpt, cfg = release.checkpoint, release.config
    inputs = {"fingerprint": ckpt.fingerprint, "format": "torch-onnx", "opset": cfg.opset, "framework": ckpt.framework}

    def body(out: Path) -> tuple[dict, str]:
        import torch
        import transformers

        log.info("export: loading %s from %s (%s)", ckpt.architecture, ckpt.path, ckpt.weights.name)
        model, n_params = hf.load_model(ckpt)
        names = hf.graph_inputs(model)
        tok = hf.write_serving_tokenizer(ckpt, out / hf.TOKENIZER_JSON)
        log.info(
            "export: %s with %.2fM parameters takes %s; serving tokenizer %s (%s, pad id %d)",
            type(model).__name__,
            n_params / 1e6,
            names,
            hf.TOKENIZER_JSON,
            tok["tokenizer_source"],
            tok["pad_id"],
        )
        facts = hf.export_onnx(
            model, names, out / HF_ONNX, opset=cfg.opset, pad_id=tok["pad_id"], tokenizer_file=out / hf.TOKENIZER_JSON
        )
        size = (out / HF_ONNX).stat().st_size
        summary = {
            "framework": ckpt.framework,
            "architecture": ckpt.architecture,
            "onnx_file": f"{OUT_DIR}/{HF_ONNX}",
            "tokenizer_file": f"{OUT_DIR}/{hf.TOKENIZER_JSON}",
            "parameters": n_params,
            "bytes": {HF_ONNX: size},
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            **tok,
            **facts,
        }
        return summary, f"{HF_ONNX} ({size / 1e6:.1f} MB, inputs {', '.join(names)}) + {hf.TOKENIZER_JSON}"

    return release.workspace.run_step(STEP, inputs, body, out_dir=OUT_DIR)


def export(release: Release) -> StepResult:
    """Export the checkpoint to ``<workspace>/static/float32.{json,pdiparams}`` (PaddleNLP) or
    ``static/model.onnx`` (transformers)."""
    ckpt = release.checkpoint
    if ckpt.is_transformers:
        return export_transformers(release)
    names = list(shipped.contract(release.settings).MODEL_INPUTS)
    inputs = {"fingerprint": ckpt.fingerprint, "format": "pir", "input_names": names}

    def body(out: Path) -> tuple[dict, str]:
        import paddle

        log.info("export: loading dygraph checkpoint %s (%s)", ckpt.path, ckpt.weights.name)
        model, n_params = _load_dygraph(release)
        log.info(
            "export: %s with %.2fM parameters; tracing with to_static(full_graph=True)",
            type(model).__name__,
            n_params / 1e6,
        )
        spec = [paddle.static.InputSpec(shape=[None, None], dtype="int64", name=name) for name in names]
        static = paddle.jit.to_static(model, full_graph=True, input_spec=spec)
        paddle.jit.save(static, str(out / PREFIX))
        model_file, params_file = static_model_files(out)
        for f in (model_file, params_file):
            if f.stat().st_size == 0:
                raise ConversionError(f"{f}: paddle.jit.save wrote an empty file.")
        sizes = {f.name: f.stat().st_size for f in (model_file, params_file)}
        for extra in out.glob("*.pdiparams.info"):
            os.remove(extra)  # optimizer bookkeeping, not part of the inference model
        summary = {
            "model_file": f"{OUT_DIR}/{model_file.name}",
            "params_file": f"{OUT_DIR}/{params_file.name}",
            "parameters": n_params,
            "bytes": sizes,
            "paddle": paddle.__version__,
        }
        return summary, f"{model_file.name} + {params_file.name} ({sizes[params_file.name] / 1e6:.1f} MB)"

    return release.workspace.run_step(STEP, inputs, body, out_dir=OUT_DIR)
