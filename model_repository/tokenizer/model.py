"""Triton python model ``tokenizer``: texts → ``input_ids``/``token_type_ids`` (INT64).

All requests of a dynamically formed batch are tokenized in one ``encode_batch`` call; each
request gets its own tensors, padded as the rendered ``padding`` parameter says (``longest``
within the request, length ``buckets`` so similar requests share a shape for a native backend's
batcher, or ``max_length``). Per-release values (vocabulary, lower-casing, max_length) come from
this version's ``release.json``, so versions stay immutable while ``config.pbtxt`` is shared.
Invalid UTF-8 fails only the request that carried it; empty texts give ``[CLS] [SEP]``; long
texts are truncated to max_length.
"""

import json
import os
import sys

import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seqcls_contract as contract
import seqcls_text


def _param(config, key, default):
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(version_dir, contract.RELEASE_FILE), encoding="utf-8") as fh:
            release = json.load(fh)
        self.max_length = int(release["max_length"])
        self.padding = _param(config, "padding", "longest")
        if self.padding not in contract.PADDINGS:
            raise pb_utils.TritonModelException(
                f"parameter padding={self.padding!r}; expected one of {contract.PADDINGS}"
            )
        self.buckets = [
            int(b) for b in _param(config, "buckets", ",".join(map(str, contract.DEFAULT_BUCKETS))).split(",")
        ]
        self.pad_id = int(release.get("pad_id", 0))
        self.tokenizer = seqcls_text.build_tokenizer(
            os.path.join(version_dir, "vocab.txt"),
            lowercase=bool(release.get("do_lower_case", True)),
            max_length=self.max_length,
        )

    def execute(self, requests):
        per_request, errors, flat = [], [], []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, contract.TEXT_INPUT).as_numpy().reshape(-1)
            texts, item_errors = seqcls_text.decode_utf8(raw)
            bad = [e for e in item_errors if e]
            errors.append("; ".join(bad) if bad else None)
            per_request.append((len(flat), len(texts)))
            flat.extend("" if bad else t for t in texts)
        ids = seqcls_text.encode(self.tokenizer, flat) if flat else []
        responses = []
        for (start, count), error in zip(per_request, errors, strict=True):
            if error:
                responses.append(
                    pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"tokenizer: {error}"))
                )
                continue
            input_ids, type_ids = seqcls_text.pad(
                ids[start : start + count],
                strategy=self.padding,
                max_length=self.max_length,
                pad_id=self.pad_id,
                buckets=self.buckets,
            )
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor(contract.MODEL_INPUTS[0], input_ids),
                        pb_utils.Tensor(contract.MODEL_INPUTS[1], type_ids),
                    ]
                )
            )
        return responses
