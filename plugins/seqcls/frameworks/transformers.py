"""The Hugging Face PyTorch side of a release: load (safetensors only), export to ONNX, the eager
reference the parity gate compares against, and the tokenizer Triton serves.

Everything after the ONNX file — parity gate, registry, ensemble, smoke, rollback, DAG — is the
same for both frameworks; this module holds what differs for a ``transformers`` checkpoint.
``torch`` and ``transformers`` are the optional ``torch`` extra, imported only here and only
when such a checkpoint is released (a Paddle-only user never imports them). Nothing read from the
checkpoint executes code or reaches beyond it: weights from ``model.safetensors`` only,
``trust_remote_code=False`` (an ``auto_map`` in ``config.json`` is never imported), local files
only, and ``tokenizer_config.json`` may not name files outside the directory (checked up front,
:mod:`seqcls.checkpoints.transformers`).

Exporter: ``torch.onnx.export(..., dynamo=False)`` (TorchScript tracing) with ``dynamic_axes`` for
batch and sequence. Why not the dynamo exporter: it needs ``onnxscript`` (one more dependency),
writes weights to an external ``*.onnx.data`` file even for tiny models, and tracing already
gives the same graph here: on DeBERTa-v2 (disentangled relative attention, p2c + c2p — the
known export trap, its relative-position buckets are computed from the sequence length) and
BERT, traced at one shape and run by ONNX Runtime at others, max |Δ| vs eager ≈ 1e-8, which the
gate re-proves on every release at the golden texts' own lengths. One trap measured here: the
wrapper module must be in eval mode — ``export`` restores the wrapper's training flag afterwards,
which would put the wrapped model in training mode (dropout on) for the eager reference.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.checkpoints.checkpoint import Checkpoint
from seqcls.checkpoints.transformers import SLOW_TOKENIZER_FILES
from seqcls.errors import CheckpointError, ConversionError, InputError

log = logging.getLogger(__name__)

EXTRA = "torch"
#: The serving tokenizer file the export step writes next to the exported graph.
TOKENIZER_JSON = "tokenizer.json"
#: Example texts the graph is traced with (two lengths, so no length is baked in by accident).
TRACE_TEXTS = ("某科技公司宣布裁员百分之十，涉及研发部门。", "球队夺冠")


def require_torch() -> None:
    """Import torch + transformers or say how to install them (the ``torch`` extra)."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise InputError(
            f"this checkpoint was saved by Hugging Face transformers; releasing it needs torch and transformers "
            f"({exc.name} is not installed): `make setup-torch`, or pip install -r requirements-torch.lock "
            f"(the seqcls[{EXTRA}] extra)."
        ) from exc


def load_model(ckpt: Checkpoint):
    """The checkpoint's ``*ForSequenceClassification`` in eval mode, from ``model.safetensors`` only;
    any missing, unexpected or reshaped weight is an error (transformers only warns and initialises
    the missing ones randomly — a release would serve noise)."""
    require_torch()
    from transformers import AutoModelForSequenceClassification

    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            str(ckpt.path),
            use_safetensors=True,
            output_loading_info=True,
            local_files_only=True,
            trust_remote_code=False,
        )
    except Exception as exc:  # transformers raises many types for a broken checkpoint
        raise CheckpointError(
            f"{ckpt.weights}: could not be loaded as a transformers sequence classifier "
            f"({type(exc).__name__}: {str(exc)[:300]})."
        ) from exc
    problems = {
        k: list(v) for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v
    }
    if problems:
        detail = "; ".join(
            f"{len(v)} {k.replace('_', ' ')} ({', '.join(map(str, v[:3]))})" for k, v in problems.items()
        )
        raise CheckpointError(
            f"{ckpt.weights}: does not match the model config.json describes — {detail}. transformers would "
            "initialise the missing ones randomly; release the checkpoint the training job saved."
        )
    model.eval()
    return model, sum(int(p.numel()) for p in model.parameters())


def graph_inputs(model) -> list[str]:
    """The id tensors the model takes, in the serving contract's order (DeBERTa-v2 without token
    types when ``type_vocab_size`` is 0: it has no table for them)."""
    import inspect

    from seqcls.serving import shipped

    accepted = set(inspect.signature(model.forward).parameters)
    names = [n for n in shipped.contract().MODEL_INPUT_NAMES if n in accepted]
    if "token_type_ids" in names and int(getattr(model.config, "type_vocab_size", 1) or 0) == 0:
        names.remove("token_type_ids")
    if "input_ids" not in names:
        raise ConversionError(f"{type(model).__name__}.forward takes no input_ids; seqcls serves text classifiers.")
    return names


def _wrapper(model, names: Sequence[str]):
    import torch

    class Logits(torch.nn.Module):
        """Positional inputs → ``logits`` only (the ONNX graph's one output)."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            return self.model(**dict(zip(names, tensors, strict=True))).logits

    return Logits().eval()


def export_onnx(model, names: Sequence[str], out_file: Path, *, opset: int, pad_id: int, tokenizer_file: Path) -> dict:
    """Trace ``model`` to ONNX with dynamic batch and sequence axes and one output, ``logits``."""
    import warnings

    import torch

    from seqcls.serving import shipped

    text = shipped.text()
    tok = text.load_tokenizer(tokenizer_file, max_length=64)
    example = text.model_feeds(text.encode(tok, list(TRACE_TEXTS)), names, pad_id=pad_id)
    args = tuple(torch.from_numpy(example[n]) for n in names)
    axes: dict[str, dict[int, str]] = {n: {0: "batch", 1: "sequence"} for n in names}
    axes["logits"] = {0: "batch"}
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # TracerWarnings about python-side shape arithmetic: the gate re-proves
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _wrapper(model, names),
            args,
            str(out_file),
            input_names=list(names),
            output_names=["logits"],
            dynamic_axes=axes,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    if not out_file.is_file() or out_file.stat().st_size == 0:
        raise ConversionError(f"{out_file}: torch.onnx.export wrote no model.")
    log.info("export: torch.onnx.export (TorchScript, opset %d) in %.1f s", opset, time.perf_counter() - t0)
    return {"exporter": "torch.onnx.export(dynamo=False)", "opset": opset, "inputs": list(names)}


def write_serving_tokenizer(ckpt: Checkpoint, out_file: Path) -> dict[str, Any]:
    """``tokenizer.json`` for Triton: the checkpoint's own fast tokenizer (converted from the slow
    tokenizer's vocabulary by ``transformers`` when the checkpoint has none), padding and
    truncation cleared (the server sets them). Returns the pad id and the tokenizer class."""
    require_torch()
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(
            str(ckpt.path), use_fast=True, local_files_only=True, trust_remote_code=False
        )
    except Exception as exc:
        raise CheckpointError(
            f"{ckpt.path}: transformers could not load its tokenizer ({type(exc).__name__}: {str(exc)[:300]})."
        ) from exc
    if not getattr(tok, "is_fast", False):
        raise CheckpointError(
            f"{ckpt.path}: tokenizer {type(tok).__name__} has no fast (tokenizers) version, which Triton serves; "
            "save the checkpoint with a fast tokenizer (tokenizer.json)."
        )
    backend = tok.backend_tokenizer
    backend.no_padding()
    backend.no_truncation()
    backend.save(str(out_file))
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    source = "tokenizer.json" if (ckpt.path / TOKENIZER_JSON).is_file() else "converted from the slow tokenizer"
    return {"tokenizer_class": type(tok).__name__, "pad_id": int(pad_id), "tokenizer_source": source}


def reference_ids(ckpt: Checkpoint, texts: Sequence[str], max_length: int) -> tuple[list[list[int]], str]:
    """Ids from ``transformers``' own tokenizer — the slow one built from the vocabulary the model was
    trained with when the checkpoint has it (so a ``tokenizer.json`` edited after training shows), else
    the fast one. Returns the ids and which tokenizer gave them."""
    from transformers import AutoTokenizer

    slow_files = [n for n in SLOW_TOKENIZER_FILES if (ckpt.path / n).is_file()]
    tok = None
    if slow_files:
        try:
            tok = AutoTokenizer.from_pretrained(
                str(ckpt.path), use_fast=False, local_files_only=True, trust_remote_code=False
            )
        except Exception as exc:  # no slow class (or sentencepiece missing): the fast one is still a reference
            log.warning(
                "validate: slow tokenizer from %s unavailable (%s); comparing with the fast one", slow_files[0], exc
            )
    if tok is None or getattr(tok, "is_fast", False):
        tok = AutoTokenizer.from_pretrained(
            str(ckpt.path), use_fast=True, local_files_only=True, trust_remote_code=False
        )
    enc = tok(list(texts), max_length=max_length, truncation=True, padding=False)
    which = f"transformers {type(tok).__name__}" + (f" ({slow_files[0]})" if not tok.is_fast and slow_files else "")
    return [list(map(int, ids)) for ids in enc["input_ids"]], which


def eager_logits(model, ids: Sequence[Sequence[int]], names: Sequence[str], pad_id: int) -> np.ndarray:
    """PyTorch eager logits on the serving ids, batched and padded as ONNX Runtime is fed."""
    import torch

    from seqcls.gates import parity
    out = []
    with torch.inference_mode():
        for feed in parity.feeds(ids, names, pad_id):
            out.append(model(**{k: torch.from_numpy(v) for k, v in feed.items()}).logits.float().numpy())
    return np.concatenate(out).astype(np.float32)
