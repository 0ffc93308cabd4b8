"""Triton python model ``tokenizer``, CLASSIC flavour: PaddleNLP's tokenizer, one request at a time.

What the PaddleNLP ``triton_serving`` sample does, kept as the baseline the benchmark compares
against (``ServingOptions(tokenizer_impl="paddlenlp")`` publishes this file as ``model.py``):
``paddlenlp.transformers.AutoTokenizer`` — which imports paddle, ~0.5 GB per stub process — and a
Python loop over the requests of a batch, each tokenized on its own and padded to its longest
text. Unlike the sample it loads the release's own vocabulary (``vocab.txt`` and, when
published, ``tokenizer_config.json`` from this version directory) instead of downloading
``ernie-3.0-medium-zh`` from a hub, and an invalid request fails alone (``INVALID_ARG``: invalid
UTF-8, a text over ``max_text_bytes``, a tensor that is not BYTES, any exception while that request
is tokenized), as in the fast ``model.py``. Outputs are the same: ``input_ids`` and
``token_type_ids`` (INT64 ``[N, L]``) per request.
"""

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seqcls_backend as backend
import seqcls_contract as contract


def _texts(raw, max_bytes):
    """Decoded texts, or a message saying why the request is refused."""
    if raw.dtype != np.object_:
        return f"tokenizer: {contract.TEXT_INPUT} must be BYTES (UTF-8 texts), got {raw.dtype}"
    texts = []
    for i, item in enumerate(raw.reshape(-1)):
        if not isinstance(item, bytes | str):
            return f"tokenizer: text {i} is {type(item).__name__}, not bytes"
        data = item.encode("utf-8") if isinstance(item, str) else item
        if len(data) > max_bytes:
            return f"tokenizer: text {i} is {len(data)} bytes, over the limit of {max_bytes} bytes (max_text_bytes)"
        try:
            texts.append(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return f"tokenizer: text {i} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
    return texts


def _load_tokenizer(version_dir, do_lower_case):
    if os.path.isfile(os.path.join(version_dir, "tokenizer_config.json")):
        from paddlenlp.transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(version_dir)
    # Only vocab.txt published: the class the release's checkpoint uses (ERNIE), same vocabulary.
    from paddlenlp.transformers import ErnieTokenizer

    return ErnieTokenizer(os.path.join(version_dir, "vocab.txt"), do_lower_case=do_lower_case)


class TritonPythonModel:
    def initialize(self, args):
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(version_dir, contract.RELEASE_FILE), encoding="utf-8") as fh:
            release = json.load(fh)
        self.max_length = int(release["max_length"])
        self.max_text_bytes = int(release.get(contract.MAX_TEXT_BYTES_KEY) or contract.MAX_TEXT_BYTES)
        self.tokenizer = _load_tokenizer(version_dir, bool(release.get("do_lower_case", True)))
        self.pad_id = int(release.get("pad_id", self.tokenizer.pad_token_id or 0))

    def _encode(self, texts):
        if not texts:
            return np.zeros((0, 2), dtype=np.int64), np.zeros((0, 2), dtype=np.int64)
        enc = self.tokenizer(texts, max_length=self.max_length, truncation=True, padding=False)
        ids = [list(map(int, x)) for x in enc["input_ids"]]
        types = [list(map(int, x)) for x in enc["token_type_ids"]]
        length = max(len(x) for x in ids)
        input_ids = np.full((len(ids), length), self.pad_id, dtype=np.int64)
        type_ids = np.zeros((len(ids), length), dtype=np.int64)
        for row, (a, b) in enumerate(zip(ids, types, strict=True)):
            input_ids[row, : len(a)] = a
            type_ids[row, : len(b)] = b
        return input_ids, type_ids

    def _answer(self, request):
        tensor = pb_utils.get_input_tensor_by_name(request, contract.TEXT_INPUT)
        if tensor is None:
            return backend.invalid(f"tokenizer: the request has no {contract.TEXT_INPUT} input")
        texts = _texts(tensor.as_numpy(), self.max_text_bytes)
        if isinstance(texts, str):
            return backend.invalid(texts)
        input_ids, type_ids = self._encode(texts)
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor(contract.MODEL_INPUTS[0], input_ids),
                pb_utils.Tensor(contract.MODEL_INPUTS[1], type_ids),
            ]
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._answer(request))
            except Exception as exc:
                backend.log_unexpected("tokenizer: one request")
                responses.append(backend.invalid(f"tokenizer: {type(exc).__name__}: {exc}"))
        return responses
