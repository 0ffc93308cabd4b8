"""Triton python model ``tokenizer``: texts → the id tensors the release's graph takes (INT64).

Which tensors (``input_ids`` and ``token_type_ids`` for a PaddleNLP ERNIE; ``attention_mask`` too,
or instead of the token types, for a transformers BERT / DeBERTa-v2) and which tokenizer
(``vocab.txt`` rebuilt to match PaddleNLP, or the checkpoint's own ``tokenizer.json``) come from
this version's ``release.json`` (``model_inputs``, ``tokenizer_file``).

All requests of a dynamically formed batch are tokenized in one ``encode_batch`` call; each
request gets its own tensors, padded as the rendered ``padding`` parameter says (``longest``
within the request, length ``buckets`` so similar requests share a shape for a native backend's
batcher, or ``max_length``). Per-release values (vocabulary, lower-casing, max_length,
max_text_bytes) come from this version's ``release.json``, so versions stay immutable while
``config.pbtxt`` is shared.

One bad request fails only itself, with ``INVALID_ARG``: invalid UTF-8, a text over
``max_text_bytes`` (refused, not truncated), a tensor that is not BYTES, or any exception while
that request is processed; the other requests of the batch are answered. Empty texts give
``[CLS] [SEP]``; texts over ``max_length`` tokens are truncated (the parity gate proves the same
ids as PaddleNLP); a request with no texts gets empty ``[0, 2]`` tensors.

Metrics (``seqcls_backend.Metrics``): texts tokenized, texts truncated at ``max_length`` and
requests refused by reason, per seqcls model and version.
"""

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seqcls_backend as backend
import seqcls_contract as contract
import seqcls_text


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(version_dir, contract.RELEASE_FILE), encoding="utf-8") as fh:
            release = json.load(fh)
        self.max_length = int(release["max_length"])
        self.max_text_bytes = int(release.get(contract.MAX_TEXT_BYTES_KEY) or contract.MAX_TEXT_BYTES)
        self.padding = backend.param(config, "padding", "longest")
        if self.padding not in contract.PADDINGS:
            raise pb_utils.TritonModelException(
                f"parameter padding={self.padding!r}; expected one of {contract.PADDINGS}"
            )
        self.buckets = [
            int(b) for b in backend.param(config, "buckets", ",".join(map(str, contract.DEFAULT_BUCKETS))).split(",")
        ]
        self.pad_id = int(release.get("pad_id", 0))
        self.inputs = list(release.get(contract.MODEL_INPUTS_KEY) or contract.MODEL_INPUTS)
        unknown = [n for n in self.inputs if n not in contract.MODEL_INPUT_NAMES]
        if unknown:
            raise pb_utils.TritonModelException(
                f"release.json model_inputs {unknown} unknown; expected a subset of {contract.MODEL_INPUT_NAMES}"
            )
        self.metrics = backend.Metrics(
            contract,
            release.get("model_name", "seqcls"),
            args["model_version"],
            enabled=backend.param(config, "metrics", "on") != "off",
        )
        for name in (contract.METRIC_TOKENIZED, contract.METRIC_TRUNCATED):
            self.metrics.declare(name)
        tokenizer_file = release.get("tokenizer_file", "vocab.txt")
        if tokenizer_file == "tokenizer.json":
            self.tokenizer = seqcls_text.load_tokenizer(
                os.path.join(version_dir, "tokenizer.json"), max_length=self.max_length
            )
        else:
            self.tokenizer = seqcls_text.build_tokenizer(
                os.path.join(version_dir, "vocab.txt"),
                lowercase=bool(release.get("do_lower_case", True)),
                max_length=self.max_length,
                # precomputed at publish (None: other Unicode tables here, or none shipped → computed)
                classes=seqcls_text.read_char_classes(os.path.join(version_dir, seqcls_text.CHAR_CLASSES_FILE)),
            )

    def _texts(self, request):
        """The request's texts, or the message saying why it is refused (never raises)."""
        try:
            tensor = pb_utils.get_input_tensor_by_name(request, contract.TEXT_INPUT)
            if tensor is None:
                return self._refuse("missing_input", f"tokenizer: the request has no {contract.TEXT_INPUT} input")
            raw = tensor.as_numpy()
            if raw.dtype != np.object_:
                return self._refuse(
                    "not_bytes", f"tokenizer: {contract.TEXT_INPUT} must be BYTES (UTF-8 texts), got {raw.dtype}"
                )
            texts, errors = seqcls_text.decode_utf8(raw.reshape(-1), max_bytes=self.max_text_bytes)
            bad = [e for e in errors if e]
            if bad:
                more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
                reason = "too_long" if "max_text_bytes" in bad[0] else "invalid_utf8"
                reason = "not_bytes" if "not bytes" in bad[0] else reason
                return self._refuse(reason, "tokenizer: " + "; ".join(bad[:3]) + more)
            return texts
        except Exception as exc:
            backend.log_unexpected("tokenizer: reading a request")
            return self._refuse("internal", f"tokenizer: could not read the request ({type(exc).__name__}: {exc})")

    def _refuse(self, reason, message):
        self.metrics.rejected(reason)
        return message

    def _encode(self, parsed):
        """Ids per request (a list, or an error message): one ``encode_batch`` for the whole batch,
        and request by request only if that call fails, so the culprit alone gets the error."""
        good = [p for p in parsed if isinstance(p, list)]
        try:
            flat, truncated = ([], 0)
            if good:
                flat, truncated = seqcls_text.encode_counted(self.tokenizer, [t for texts in good for t in texts])
            self.metrics.count(contract.METRIC_TOKENIZED, len(flat))
            self.metrics.count(contract.METRIC_TRUNCATED, truncated)
            out, start = [], 0
            for p in parsed:
                if isinstance(p, list):
                    out.append(flat[start : start + len(p)])
                    start += len(p)
                else:
                    out.append(p)
            return out
        except Exception:
            backend.log_unexpected("tokenizer: encode_batch failed; retrying request by request")
        out = []
        for p in parsed:
            try:
                if isinstance(p, list):
                    ids, truncated = seqcls_text.encode_counted(self.tokenizer, p)
                    self.metrics.count(contract.METRIC_TOKENIZED, len(ids))
                    self.metrics.count(contract.METRIC_TRUNCATED, truncated)
                    out.append(ids)
                else:
                    out.append(p)
            except Exception as exc:
                why = f"tokenizer: tokenization failed ({type(exc).__name__}: {exc})"
                out.append(self._refuse("tokenize_failed", why))
        return out

    def _response(self, ids):
        if isinstance(ids, str):
            return backend.invalid(ids)
        try:
            tensors = seqcls_text.model_feeds(
                ids,
                self.inputs,
                strategy=self.padding,
                max_length=self.max_length,
                pad_id=self.pad_id,
                buckets=self.buckets,
            )
            return pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(name, tensors[name]) for name in self.inputs]
            )
        except Exception as exc:
            backend.log_unexpected("tokenizer: building a response")
            self.metrics.rejected("internal")
            return backend.invalid(f"tokenizer: could not build the response ({type(exc).__name__}: {exc})")

    def finalize(self):
        self.metrics.close()

    def execute(self, requests):
        return [self._response(ids) for ids in self._encode([self._texts(r) for r in requests])]
