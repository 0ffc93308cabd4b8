"""The Hugging Face PyTorch side of a release: the checkpoint's checks, load (safetensors only),
export to ONNX, the eager reference the parity gate compares against, and the tokenizer Triton serves.

Everything after the ONNX file — parity gate, registry, ensemble, smoke, rollback, DAG — is the
same for both frameworks; this module holds what differs for a ``transformers`` checkpoint.
``torch`` and ``transformers`` are the optional ``torch`` extra, imported only here and only
when such a checkpoint is released (a Paddle-only user never imports them). Nothing read from the
checkpoint executes code or reaches beyond it: weights from ``model.safetensors`` only (a
``pytorch_model.bin`` is converted to it at intake through PyTorch's restricted unpickler:
:mod:`seqcls.checkpoints.torchload`),
``trust_remote_code=False`` (an ``auto_map`` in ``config.json`` is never imported), local files
only, and ``tokenizer_config.json`` may not name files outside the directory (checked up front).

Checked up front, cheaply (no torch import), besides the common checks: a multi-label
``*ForSequenceClassification`` (sigmoid per label), one set of weights (``model.safetensors``, or
``pytorch_model.bin`` / its shards, scanned statically), and a tokenizer Triton can serve (``tokenizer.json``, or the
slow tokenizer's vocabulary it is converted from at export) whose ids fit the embedding table.

Exporter: ``torch.onnx.export(..., dynamo=False)`` (TorchScript tracing) with ``dynamic_axes`` for
batch and sequence. Why not the dynamo exporter: it needs ``onnxscript`` (one more dependency),
writes weights to an external ``*.onnx.data`` file even for tiny models, and tracing already
gives the same graph here: on DeBERTa-v2 (disentangled relative attention, p2c + c2p — the
known export trap, its relative-position buckets are computed from the sequence length) and
BERT, traced at one shape and run by ONNX Runtime at others, max |Δ| vs eager ≈ 1e-8, which the
gate re-proves on every release at the golden texts' own lengths. One trap measured here: the
wrapper module must be in eval mode — ``export`` restores the wrapper's training flag afterwards,
which would put the wrapped model in training mode (dropout on) for the eager reference.

DeBERTa-v2 is traced without its one scripted branch (:func:`_deberta_rpos_traced`): TorchScript
turns it into an ``If`` node per layer, whose subgraphs ORT's symbolic shape inference re-infers on
every pass of the BERT fusions — minutes per convert of a base-size model for a branch that a
self-attention layer never takes.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.checkpoints.checkpoint import (
    MODEL_FILES,
    OTHER_WEIGHT_FILES,
    Checkpoint,
    find_weights,
    read_json,
    read_vocab,
)
from seqcls.checkpoints.torchload import TORCH_INDEX, TORCH_WEIGHTS
from seqcls.config import ReleaseConfig
from seqcls.contract import shipped
from seqcls.contract.runtime import feeds
from seqcls.errors import CheckpointError, ConversionError, InputError
from seqcls.frameworks.common import Intake, Records, ServingTokenizer
from seqcls.settings import Settings

log = logging.getLogger(__name__)

EXTRA = "torch"
#: The serving tokenizer file the export step writes next to the exported graph.
TOKENIZER_JSON = "tokenizer.json"
#: Example texts the graph is traced with (two lengths, so no length is baked in by accident).
TRACE_TEXTS = ("某科技公司宣布裁员百分之十，涉及研发部门。", "球队夺冠")
#: The ONNX file the export step writes (convert verifies it like paddle2onnx's output).
ONNX_FILE = "model.onnx"

# ----------------------------------------------------------------------------- checkpoint checks

#: Tokenizer files a ``transformers`` checkpoint may carry (fingerprinted when present): the fast
#: tokenizer's ``tokenizer.json`` (what Triton serves) and the slow tokenizer's vocabulary.
SLOW_TOKENIZER_FILES = ("vocab.txt", "spm.model", "sentencepiece.bpe.model", "tokenizer.model")
HF_TOKENIZER_FILES = ("tokenizer.json", *SLOW_TOKENIZER_FILES)
HF_MODEL_FILES = (*MODEL_FILES, *(n for n in HF_TOKENIZER_FILES if n not in MODEL_FILES), "added_tokens.json")
#: What ``transformers`` would read instead of (or besides) ``model.safetensors``: other libraries' weights.
HF_OTHER_WEIGHTS = tuple(n for n in OTHER_WEIGHT_FILES if n != TORCH_WEIGHTS)


def check_config(config: dict, path: Path) -> None:
    """A ``transformers`` classifier seqcls can serve: multi-label (sigmoid per label), known architecture."""
    arch = config.get("architectures") or []
    if not arch:
        raise CheckpointError(
            f"{path}: no architectures; save the model with save_pretrained (it records e.g. "
            "BertForSequenceClassification)."
        )
    problem = config.get("problem_type")
    if problem != "multi_label_classification":
        raise CheckpointError(
            f"{path}: problem_type is {problem!r}; seqcls serves multi-label classifiers (a sigmoid per label, "
            "thresholded) — train with problem_type='multi_label_classification' (the model then uses "
            "BCEWithLogitsLoss) or set it in config.json if that is how the model was trained."
        )


def refuse_other_weights(root: Path) -> None:
    """Weights besides the one set a release reads are refused: a pickle beside ``model.safetensors``,
    other libraries' (TensorFlow, Flax), Paddle's."""

    def present(name: str) -> bool:
        return (root / name).exists() or (root / name).is_symlink()

    if present("model.safetensors"):
        pickles = [n for n in (TORCH_WEIGHTS, TORCH_INDEX) if present(n)]
        if pickles:
            raise CheckpointError(
                f"{root / pickles[0]}: beside model.safetensors — two sets of weights, and the release would record "
                f"one while another reader could load the other; keep model.safetensors and remove {pickles[0]}."
            )
    others = [n for n in HF_OTHER_WEIGHTS if present(n)]
    if others:
        raise CheckpointError(
            f"{root / others[0]}: seqcls releases transformers checkpoints from model.safetensors or pytorch_model.bin "
            f"(PyTorch's); re-save with save_pretrained(..., safe_serialization=True) and remove {others[0]}."
        )
    if (root / "model_state.pdparams").exists():
        raise CheckpointError(
            f"{root / 'model_state.pdparams'}: a PaddlePaddle weights file in a transformers checkpoint "
            "(config.json has transformers_version); keep model.safetensors only."
        )


def refuse_outside_files(root: Path, tok_cfg: dict) -> None:
    """transformers passes a ``*_file`` key of ``tokenizer_config.json`` (``vocab_file``,
    ``tokenizer_file``, ``merges_file``...) to the tokenizer as it is, so a config naming
    ``/elsewhere/vocab.txt`` makes it read that file instead of the checkpoint's. Only files
    inside the checkpoint directory are allowed (``save_pretrained`` writes none of these keys)."""
    for key, value in tok_cfg.items():
        if not key.endswith("_file") or value is None:
            continue
        target = (root / str(value)).resolve() if isinstance(value, str) else None
        if target is None or not target.is_relative_to(root):
            raise CheckpointError(
                f"{root / 'tokenizer_config.json'}: {key} names {value!r}, outside the checkpoint {root}; "
                f"transformers would read it instead of the checkpoint's own file — remove the {key} key "
                "(save_pretrained does not write it)."
            )


def read_tokenizer(root: Path, config: dict) -> tuple[bool, int]:
    """``(do_lower_case, vocabulary size)`` of a transformers checkpoint's tokenizer, cheaply checked.

    The Triton tokenizer serves ``tokenizer.json`` (built from the slow tokenizer's files at export
    when the checkpoint has none); the parity gate proves it gives the ids ``transformers`` does.
    """
    tok_cfg = read_json(root / "tokenizer_config.json", "save_pretrained writes the tokenizer config there")
    refuse_outside_files(root, tok_cfg)
    present = [n for n in HF_TOKENIZER_FILES if (root / n).is_file()]
    if not present:
        raise CheckpointError(
            f"{root}: no tokenizer — expected tokenizer.json (a fast tokenizer's save_pretrained) or the slow "
            f"tokenizer's vocabulary ({', '.join(SLOW_TOKENIZER_FILES)})."
        )
    vocab_size = int(config.get("vocab_size", 0)) or None
    size = 0
    if (root / "tokenizer.json").is_file():
        data = read_json(root / "tokenizer.json", "a fast tokenizer's save_pretrained writes it")
        model = data.get("model")
        if not isinstance(model, dict) or "vocab" not in model:
            raise CheckpointError(f"{root / 'tokenizer.json'}: no model.vocab; is this a tokenizers file?")
        vocab = model["vocab"]
        ids = vocab.values() if isinstance(vocab, dict) else range(len(vocab))
        added = [t.get("id", 0) for t in data.get("added_tokens") or [] if isinstance(t, dict)]
        size = max([*ids, *added], default=-1) + 1
    elif (root / "vocab.txt").is_file():
        size = len(read_vocab(root, config))
    if vocab_size is not None and size > vocab_size:
        raise CheckpointError(
            f"{root / present[0]}: ids up to {size - 1} but config.json vocab_size is {vocab_size}; ids past the "
            "embedding table would crash the model — use the tokenizer it was trained with."
        )
    return bool(tok_cfg.get("do_lower_case", True)), size


# ----------------------------------------------------------------------------- load, export


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


def _rpos_of_self_attention(query_layer, key_layer, relative_pos, *_buckets: int):
    """DeBERTa-v2's ``build_rpos`` for self-attention: the given relative positions.

    The original rebuilds them only when query and key lengths differ; in the encoder's
    self-attention both are projections of the same hidden states, so they never do."""
    return relative_pos


@contextlib.contextmanager
def _deberta_rpos_traced(model):
    """Trace a DeBERTa-v2 ``model`` with :func:`_rpos_of_self_attention` in place of the scripted
    ``build_rpos`` (restored after): the graph carries no ``If`` node. Other models: unchanged."""
    if getattr(getattr(model, "config", None), "model_type", None) != "deberta-v2":
        yield
        return
    from transformers.models.deberta_v2 import modeling_deberta_v2 as deberta

    original = getattr(deberta, "build_rpos", None)
    if original is None:  # a transformers release without the scripted helper: nothing to replace
        yield
        return
    deberta.build_rpos = _rpos_of_self_attention
    try:
        yield
    finally:
        deberta.build_rpos = original


def export_onnx(model, names: Sequence[str], out_file: Path, *, opset: int, pad_id: int, tokenizer_file: Path) -> dict:
    """Trace ``model`` to ONNX with dynamic batch and sequence axes and one output, ``logits``."""
    import torch

    text = shipped.text()
    tok = text.load_tokenizer(tokenizer_file, max_length=64)
    example = text.model_feeds(text.encode(tok, list(TRACE_TEXTS)), names, pad_id=pad_id)
    args = tuple(torch.from_numpy(example[n]) for n in names)
    axes: dict[str, dict[int, str]] = {n: {0: "batch", 1: "sequence"} for n in names}
    axes["logits"] = {0: "batch"}
    t0 = time.perf_counter()
    with warnings.catch_warnings(), _deberta_rpos_traced(model):  # TracerWarnings: the gate re-proves
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


def export_checkpoint(ckpt: Checkpoint, out: Path, rel: str, *, opset: int) -> tuple[dict[str, Any], str]:
    """Export to ``out/model.onnx`` + the serving ``tokenizer.json``; the summary names them as
    ``rel/<file>`` (``rel``: ``out`` inside the workspace)."""
    log.info("export: loading %s from %s (%s)", ckpt.architecture, ckpt.path, ckpt.weights.name)
    model, n_params = load_model(ckpt)
    names = graph_inputs(model)
    tok = write_serving_tokenizer(ckpt, out / TOKENIZER_JSON)
    log.info(
        "export: %s with %.2fM parameters takes %s; serving tokenizer %s (%s, pad id %d)",
        type(model).__name__,
        n_params / 1e6,
        names,
        TOKENIZER_JSON,
        tok["tokenizer_source"],
        tok["pad_id"],
    )
    facts = export_onnx(
        model, names, out / ONNX_FILE, opset=opset, pad_id=tok["pad_id"], tokenizer_file=out / TOKENIZER_JSON
    )
    size = (out / ONNX_FILE).stat().st_size
    summary = {
        "framework": ckpt.framework,
        "architecture": ckpt.architecture,
        "onnx_file": f"{rel}/{ONNX_FILE}",
        "tokenizer_file": f"{rel}/{TOKENIZER_JSON}",
        "parameters": n_params,
        "bytes": {ONNX_FILE: size},
        **TRANSFORMERS.version_facts(),
        **tok,
        **facts,
    }
    return summary, f"{ONNX_FILE} ({size / 1e6:.1f} MB, inputs {', '.join(names)}) + {TOKENIZER_JSON}"


# ----------------------------------------------------------------------------- references


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

    out = []
    with torch.inference_mode():
        for feed in feeds(ids, names, pad_id):
            out.append(model(**{k: torch.from_numpy(v) for k, v in feed.items()}).logits.float().numpy())
    return np.concatenate(out).astype(np.float32)


# ----------------------------------------------------------------------------- the adapter


class Transformers:
    """Hugging Face ``transformers`` checkpoints (see :class:`seqcls.frameworks.Framework` for the members)."""

    name = "transformers"
    reference_runtime = "PyTorch"
    artifact_dir = "torch_export"
    packages = ("torch", "transformers")
    model_files = HF_MODEL_FILES

    def check_checkpoint(self, root: Path, config: dict, *, allow_unsafe_pickle: bool = False) -> Intake:
        check_config(config, root / "config.json")
        refuse_other_weights(root)
        weights = find_weights(root, allow_unsafe_pickle, torch_pickles=True)
        do_lower_case, vocab_size = read_tokenizer(root, config)
        return Intake(weights, do_lower_case, vocab_size)

    def serving_tokenizer(self, ckpt: Checkpoint, records: Records) -> ServingTokenizer:
        summary = records.require("export")["summary"]
        return ServingTokenizer(
            records.path(summary["tokenizer_file"]), "tokenizer.json", int(summary.get("pad_id", 0)), ckpt.do_lower_case
        )

    def export_inputs(self, ckpt: Checkpoint, config: ReleaseConfig, settings: Settings) -> dict[str, Any]:
        require_torch()  # before the step starts: say how to install the extra
        return {
            "fingerprint": ckpt.fingerprint,
            "format": "torch-onnx",
            "opset": config.opset,
            "framework": ckpt.framework,
        }

    def export(
        self, ckpt: Checkpoint, out: Path, *, rel: str, config: ReleaseConfig, settings: Settings
    ) -> tuple[dict[str, Any], str]:
        return export_checkpoint(ckpt, out, rel, opset=config.opset)

    def exported_onnx(self, summary: dict[str, Any]) -> str | None:
        return summary.get("onnx_file")  # PyTorch's exporter wrote ONNX already

    def reference_ids(self, ckpt: Checkpoint, texts: Sequence[str], max_length: int) -> tuple[list[list[int]], str]:
        return reference_ids(ckpt, texts, max_length)

    def reference_logits(
        self, ckpt: Checkpoint, exported: Path, ids: Sequence[Sequence[int]], *, input_names: Sequence[str], pad_id: int
    ) -> np.ndarray:
        model, _ = load_model(ckpt)  # eager, from the checkpoint itself (not from what export wrote)
        return eager_logits(model, ids, input_names, pad_id)

    def version_facts(self) -> dict[str, str]:
        import torch
        import transformers

        return {"torch": torch.__version__, "transformers": transformers.__version__}


TRANSFORMERS = Transformers()
