"""The registered MLflow model: texts in, label names and probabilities out — what Triton answers.

``register`` logs this file as an MLflow *model from code*: MLflow stores the file itself in the
model (``python_model``) and runs it at load time, so the model needs no ``seqcls`` installed.
What it imports besides numpy, pandas, onnxruntime and mlflow are the files Triton's python
models run, shipped as the model's ``code_paths``: ``seqcls_text.py`` (the tokenizer),
``seqcls_decide.py`` (sigmoid, thresholds, hierarchy), ``seqcls_contract.py`` and ``seqcls_engine.py``
(profile ``bf16``: the graph runs on OpenVINO at bf16, as Triton runs it; needs ``openvino`` installed).

Artifacts: ``release`` — the ``release.json`` publish writes into
every Triton version (labels, thresholds, hierarchy, max_length, do_lower_case, pad_id, ...);
``vocab`` — the serving tokenizer's file (the checkpoint's ``vocab.txt``, or for a transformers
checkpoint the exported ``tokenizer.json``: ``release.json``'s ``tokenizer_file`` says which);
``onnx`` — the served ONNX graph, fed the inputs ``release.json``'s ``model_inputs`` names.

``predict`` takes a list of strings, a pandas DataFrame with a ``text`` column (or one column),
a Series or a numpy array of strings, and returns one row per text: ``labels`` (label names after
thresholds and hierarchy, in label order), ``confidences`` (one per label in ``labels``: what
Triton's ``predictions`` carry — a parent implied by a child gets the larger of the two) and
``probabilities`` (sigmoid of every label's logit, in the order of ``release.json``'s ``labels``,
also in the model's metadata). Each text runs alone, as a single-text Triton request does: its
answer never depends on the other texts of the call (an ``int8`` graph moves with padding). A
text that is not a string, or longer than ``max_text_bytes``, fails the call naming it (Triton
answers ``INVALID_ARG``; ``mlflow models serve`` answers 400). ``model_config``:
``intra_op_threads`` (ONNX Runtime threads, 0 = its default).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import mlflow
import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

TEXT_COLUMN = "text"
OUTPUT_COLUMNS = ("labels", "confidences", "probabilities")
#: The shipped serving files (``code_paths``), the contract first: the others import it by name.
SERVING_MODULES = ("seqcls_contract", "seqcls_text", "seqcls_decide")
#: The engine of a profile ONNX Runtime cannot run (``bf16``: OpenVINO); absent from models registered before it.
ENGINE_MODULE = "seqcls_engine"


class SeqclsClassifier(PythonModel):
    """Tokenizer → ONNX Runtime → decision, with the serving code Triton runs."""

    def load_context(self, context) -> None:
        import onnxruntime as ort

        # the model's code_paths (<model>/code/, beside <model>/artifacts/): the files Triton runs
        seqcls_contract, seqcls_text, seqcls_decide = _serving_code(
            Path(context.artifacts["release"]).resolve().parents[1] / "code"
        )
        self._text, self._decide = seqcls_text, seqcls_decide
        with open(context.artifacts["release"], encoding="utf-8") as fh:
            release = json.load(fh)
        self.labels = list(release["labels"])
        self.thresholds = np.asarray(release["thresholds"], dtype=np.float32)
        if len(self.thresholds) != len(self.labels):
            raise ValueError("release.json: thresholds and labels differ in length")
        self.hierarchy = bool(release.get("hierarchy", True))
        self.max_text_bytes = int(release.get(seqcls_contract.MAX_TEXT_BYTES_KEY) or seqcls_contract.MAX_TEXT_BYTES)
        if release.get("tokenizer_file") == "tokenizer.json":
            self.tokenizer = seqcls_text.load_tokenizer(
                context.artifacts["vocab"], max_length=int(release["max_length"])
            )
        else:
            table = context.artifacts.get("char_classes")  # absent in models registered before it was shipped
            self.tokenizer = seqcls_text.build_tokenizer(
                context.artifacts["vocab"],
                lowercase=bool(release.get("do_lower_case", True)),
                max_length=int(release["max_length"]),
                classes=seqcls_text.read_char_classes(table) if table else None,
            )
        self.pad_id = int(release.get("pad_id", 0))
        options = ort.SessionOptions()
        options.intra_op_num_threads = int((context.model_config or {}).get("intra_op_threads", 0))
        profile = release.get("profile")
        engine = _engine_code(Path(context.artifacts["release"]).resolve().parents[1] / "code")
        if engine is not None and profile in engine.ENGINES:  # bf16: the graph on OpenVINO, as Triton runs it
            self.session = engine.session(context.artifacts["onnx"], profile, options.intra_op_num_threads)
        else:
            self.session = ort.InferenceSession(
                context.artifacts["onnx"], sess_options=options, providers=["CPUExecutionProvider"]
            )
        self.output = seqcls_contract.LOGITS_OUTPUT
        self.inputs = list(release.get(seqcls_contract.MODEL_INPUTS_KEY) or seqcls_contract.MODEL_INPUTS)

    def _logits(self, ids: list[int]) -> np.ndarray:
        feeds = self._text.model_feeds([ids], self.inputs, strategy="longest", pad_id=self.pad_id)
        return self.session.run([self.output], feeds)[0]

    def predict(self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        """One row per text (see the module doc); MLflow hands a DataFrame over, a direct call may pass any form."""
        texts, errors = self._text.decode_utf8(_items(model_input), max_bytes=self.max_text_bytes)
        bad = [e for e in errors if e]
        if bad:
            more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
            raise _invalid("; ".join(bad[:3]) + more)
        ids = self._text.encode(self.tokenizer, texts) if texts else []
        logits = [self._logits(x) for x in ids]
        probs = self._decide.sigmoid(np.concatenate(logits)) if logits else np.zeros((0, len(self.labels)), np.float32)
        rows = self._decide.decide(probs, self.thresholds, self.labels, hierarchy=self.hierarchy)
        return pd.DataFrame(
            {
                "labels": [[label for label, _ in row] for row in rows],
                "confidences": [[float(c) for _, c in row] for row in rows],
                "probabilities": [[float(x) for x in p] for p in probs],
            },
            columns=list(OUTPUT_COLUMNS),
        )


def _items(model_input: Any) -> list[Any]:
    """The texts of any accepted input form, one item per text (not yet checked to be strings)."""
    if isinstance(model_input, pd.DataFrame):
        if TEXT_COLUMN in model_input.columns:
            return model_input[TEXT_COLUMN].tolist()
        if len(model_input.columns) == 1:
            return model_input.iloc[:, 0].tolist()
        raise _invalid(f"expected a DataFrame with a {TEXT_COLUMN!r} column, got columns {list(model_input.columns)}")
    if isinstance(model_input, dict) and TEXT_COLUMN in model_input:
        return _items(model_input[TEXT_COLUMN])
    if isinstance(model_input, str | bytes):
        return [model_input]
    if isinstance(model_input, pd.Series | np.ndarray):
        return np.asarray(model_input, dtype=object).reshape(-1).tolist()
    if isinstance(model_input, list | tuple):
        return list(model_input)
    raise _invalid(
        f"expected texts (a list of strings or a DataFrame with a {TEXT_COLUMN!r} column), got {model_input!r:.200}"
    )


def _engine_code(code: Path) -> ModuleType | None:
    """This model's ``seqcls_engine`` from its own file (None for a model registered before it was shipped)."""
    path = code / f"{ENGINE_MODULE}.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"_seqcls_pyfunc_{uuid.uuid4().hex}", path)
    assert spec is not None and spec.loader is not None, code
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _serving_code(code: Path) -> list[ModuleType]:
    """This model's ``seqcls_contract``, ``seqcls_text``, ``seqcls_decide``, loaded from its own files.

    Not ``import seqcls_text``: Python imports a name once per process, so a second model (another
    release, other serving code) loaded in the same process would silently run the first one's.
    ``seqcls_text`` imports ``seqcls_contract`` by name: it finds this model's while it loads.
    """
    loaded: list[ModuleType] = []
    before = sys.modules.get(SERVING_MODULES[0])
    try:
        for name in SERVING_MODULES:
            spec = importlib.util.spec_from_file_location(f"_seqcls_pyfunc_{uuid.uuid4().hex}", code / f"{name}.py")
            assert spec is not None and spec.loader is not None, code
            module = importlib.util.module_from_spec(spec)
            if name == SERVING_MODULES[0]:
                sys.modules[name] = module
            spec.loader.exec_module(module)
            loaded.append(module)
    finally:
        if before is None:
            sys.modules.pop(SERVING_MODULES[0], None)
        else:
            sys.modules[SERVING_MODULES[0]] = before
    return loaded


def _invalid(message: str) -> Exception:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException(f"seqcls: {message}", error_code=INVALID_PARAMETER_VALUE)


mlflow.models.set_model(SeqclsClassifier())
