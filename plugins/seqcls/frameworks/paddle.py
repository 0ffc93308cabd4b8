"""The PaddleNLP side of a release: its checkpoint's tokenizer checks, the export to a static
graph, and the references the parity gate compares the served graph with.

Export: dygraph checkpoint → static graph (``paddle.jit.to_static`` + ``jit.save``); Paddle 3
writes the PIR format (``float32.json`` + ``float32.pdiparams``), older exports are
``float32.pdmodel`` — :func:`static_model_files` reads either, so convert and validate accept
both. References: PaddleNLP's own tokenizer (ids) and Paddle Inference on the static model
(logits). ``paddle`` and ``paddlenlp`` are imported only inside the functions that need them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.checkpoints.checkpoint import MODEL_FILES, Checkpoint, config_file, find_weights, read_json, read_vocab
from seqcls.checkpoints.safeload import scan_pickle
from seqcls.config import ReleaseConfig
from seqcls.contract import shipped
from seqcls.contract.runtime import feeds
from seqcls.errors import CheckpointError, ConversionError
from seqcls.frameworks.common import Intake, Records, ServingTokenizer
from seqcls.settings import Settings

log = logging.getLogger(__name__)

PREFIX = "float32"
WORDPIECE_TOKENIZERS = {"ErnieTokenizer", "BertTokenizer", "ErnieTokenizerFast", "BertTokenizerFast"}


# ----------------------------------------------------------------------------- checkpoint checks


def read_do_lower_case(root: Path) -> bool:
    """``do_lower_case`` from ``tokenizer_config.json``; refuses a non-WordPiece tokenizer."""
    tok_cfg = read_json(root / "tokenizer_config.json", "save_pretrained writes the tokenizer config there")
    tok_class = tok_cfg.get("tokenizer_class")
    if tok_class and tok_class not in WORDPIECE_TOKENIZERS:
        raise CheckpointError(
            f"{root / 'tokenizer_config.json'}: tokenizer_class {tok_class!r} is not supported; "
            f"seqcls serves WordPiece vocabularies ({', '.join(sorted(WORDPIECE_TOKENIZERS))})."
        )
    return bool(tok_cfg.get("do_lower_case", True))


# ----------------------------------------------------------------------------- export


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


def load_dygraph(ckpt: Checkpoint, *, allow_unsafe_pickle: bool = False):
    """The checkpoint's PaddleNLP classifier in eval mode, every tensor checked against the file."""
    import paddle
    from paddlenlp.transformers import AutoModelForSequenceClassification

    paddle.set_device("cpu")
    if ckpt.weights.suffix == ".pdparams":
        # again: the file may have changed since the checkpoint step
        scan_pickle(ckpt.weights, allow_unsafe=allow_unsafe_pickle)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(str(ckpt.path))
    except Exception as exc:  # paddlenlp raises many types for a broken checkpoint
        raise CheckpointError(
            f"{ckpt.weights}: could not be loaded as a PaddleNLP sequence classifier "
            f"({type(exc).__name__}: {str(exc)[:300]})."
        ) from exc
    model.eval()
    verify_loaded(model, ckpt.weights, allow_unsafe=allow_unsafe_pickle)
    n_params = sum(int(p.size) for p in model.parameters())
    return model, n_params


def _file_tensors(weights: Path, allow_unsafe: bool = False) -> dict:
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
            f"{weights}: does not match the model {config_file(weights.parent).name} describes — {len(missing)} "
            "parameters missing"
            f"{' (' + few(missing) + ')' if missing else ''}, {len(unexpected)} unexpected"
            f"{' (' + few(unexpected) + ')' if unexpected else ''}, {len(wrong_shape)} with another shape"
            f"{' (' + few(wrong_shape) + ')' if wrong_shape else ''}. PaddleNLP would initialise the missing "
            "ones randomly; release the checkpoint the training job saved, with its own model config."
        )
    differ = [
        k
        for k in current
        if not np.array_equal(current[k].numpy(), np.asarray(stored[k]).astype(current[k].numpy().dtype))
    ]
    if differ:
        raise CheckpointError(f"{weights}: {len(differ)} tensors differ after loading (e.g. {differ[0]}).")


def export_static(
    ckpt: Checkpoint, out: Path, rel: str, names: Sequence[str], *, allow_unsafe_pickle: bool = False
) -> tuple[dict[str, Any], str]:
    """Trace the checkpoint to ``out/float32.{json,pdiparams}`` taking ``names``; the summary names
    its files as ``rel/<file>`` (``rel``: ``out`` inside the workspace)."""
    import paddle

    log.info("export: loading dygraph checkpoint %s (%s)", ckpt.path, ckpt.weights.name)
    model, n_params = load_dygraph(ckpt, allow_unsafe_pickle=allow_unsafe_pickle)
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
        "model_file": f"{rel}/{model_file.name}",
        "params_file": f"{rel}/{params_file.name}",
        "parameters": n_params,
        "bytes": sizes,
        **PADDLE.version_facts(),
    }
    return summary, f"{model_file.name} + {params_file.name} ({sizes[params_file.name] / 1e6:.1f} MB)"


# ----------------------------------------------------------------------------- references


def paddlenlp_ids(checkpoint_dir: Path, texts: Sequence[str], max_length: int) -> list[list[int]]:
    from paddlenlp.transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(checkpoint_dir))
    enc = tok(list(texts), max_length=max_length, truncation=True, padding=False)
    return [list(map(int, ids)) for ids in enc["input_ids"]]


def paddle_predictor(static_dir: Path, threads: int = 2):
    """A Paddle Inference predictor (CPU) of the static model in ``static_dir``."""
    import paddle.inference as paddle_infer

    model_file, params_file = static_model_files(static_dir)
    cfg = paddle_infer.Config(str(model_file), str(params_file))
    cfg.disable_gpu()
    cfg.set_cpu_math_library_num_threads(threads)
    cfg.disable_glog_info()
    return paddle_infer.create_predictor(cfg)


def predictor_logits(predictor, ids: Sequence[Sequence[int]]) -> np.ndarray:
    """``predictor``'s logits on ``ids``, batched as served (one predictor: one caller at a time)."""
    names = predictor.get_input_names()
    out = []
    for feed in feeds(ids, shipped.contract().MODEL_INPUTS):
        for name in names:
            handle = predictor.get_input_handle(name)
            handle.reshape(list(feed[name].shape))
            handle.copy_from_cpu(feed[name])
        predictor.run()
        out.append(predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu())
    return np.concatenate(out).astype(np.float32)


def paddle_logits(static_dir: Path, ids: Sequence[Sequence[int]], threads: int = 2) -> np.ndarray:
    """Paddle Inference's logits on the static model in ``static_dir``, batched as served."""
    return predictor_logits(paddle_predictor(static_dir, threads), ids)


# ----------------------------------------------------------------------------- the adapter


class Paddle:
    """PaddleNLP checkpoints (see :class:`seqcls.frameworks.Framework` for what each member is)."""

    name = "paddle"
    reference_runtime = "Paddle"
    artifact_dir = "paddle_static"
    packages = ("paddlepaddle", "paddlenlp", "paddle2onnx")
    model_files = MODEL_FILES

    def check_checkpoint(self, root: Path, config: dict, *, allow_unsafe_pickle: bool = False) -> Intake:
        weights = find_weights(root, allow_unsafe_pickle)
        return Intake(weights, read_do_lower_case(root), len(read_vocab(root, config, config_file(root).name)))

    def serving_tokenizer(self, ckpt: Checkpoint, records: Records) -> ServingTokenizer:
        vocab = ckpt.vocab_file.read_text(encoding="utf-8").splitlines()
        pad_id = vocab.index("[PAD]") if "[PAD]" in vocab else 0
        return ServingTokenizer(ckpt.vocab_file, "wordpiece", pad_id, ckpt.do_lower_case)

    def export_inputs(self, ckpt: Checkpoint, config: ReleaseConfig, settings: Settings) -> dict[str, Any]:
        names = list(shipped.contract(settings).MODEL_INPUTS)
        return {"fingerprint": ckpt.fingerprint, "format": "pir", "input_names": names}

    def export(
        self, ckpt: Checkpoint, out: Path, *, rel: str, config: ReleaseConfig, settings: Settings
    ) -> tuple[dict[str, Any], str]:
        names = list(shipped.contract(settings).MODEL_INPUTS)
        return export_static(ckpt, out, rel, names, allow_unsafe_pickle=config.allow_unsafe_pickle)

    def exported_onnx(self, summary: dict[str, Any]) -> str | None:
        return None  # a static graph: convert runs paddle2onnx on it

    def reference_ids(self, ckpt: Checkpoint, texts: Sequence[str], max_length: int) -> tuple[list[list[int]], str]:
        return paddlenlp_ids(ckpt.path, texts, max_length), "paddlenlp"

    def reference_logits(
        self, ckpt: Checkpoint, exported: Path, ids: Sequence[Sequence[int]], *, input_names: Sequence[str], pad_id: int
    ) -> np.ndarray:
        # the static graph takes the Paddle pair, padded with 0 as the gate always fed it
        return paddle_logits(exported, ids)

    def version_facts(self) -> dict[str, str]:
        import paddle

        return {"paddle": paddle.__version__}


PADDLE = Paddle()
