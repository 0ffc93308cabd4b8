"""The serving contract: every name and enum that both seqcls and the Triton models use, once.

Shipped next to each python model's ``model.py`` (Triton has no ``seqcls`` package) and
imported by the library through :mod:`seqcls.serving.shipped`, so the renderer, the smoke test
and the servers cannot disagree on a tensor name or a strategy. Standard library only.
"""

#: The ensemble's request and response tensors (KServe v2 names).
TEXT_INPUT = "TEXT"
PREDICTIONS_OUTPUT = "predictions"
PROBABILITIES_OUTPUT = "probabilities"
#: The ONNX graph's tensors (convert renames paddle2onnx's ``fetch_name_0`` to ``logits``).
#: Every id tensor a served graph may take, in this order; each graph declares a subset, recorded
#: per version in ``release.json`` under :data:`MODEL_INPUTS_KEY`: PaddleNLP's ERNIE takes
#: ``input_ids`` + ``token_type_ids`` (it derives its mask from the pad id), HF BERT all three,
#: HF DeBERTa-v2 ``input_ids`` + ``attention_mask`` (no token types when ``type_vocab_size`` is 0).
MODEL_INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")
#: The Paddle graph's inputs: what a version whose ``release.json`` names none takes.
MODEL_INPUTS = ("input_ids", "token_type_ids")
MODEL_INPUTS_KEY = "model_inputs"
LOGITS_OUTPUT = "logits"

#: How the tokenizer pads the texts of one request into an ``[N, L]`` tensor.
#: - ``longest``: to the request's longest text (smallest tensor);
#: - ``buckets``: to the next bucket boundary, so requests of similar length share a shape and
#:   a native backend's dynamic batcher can merge them (GPU);
#: - ``max_length``: always to ``max_length`` (one shape for everything; wasteful on CPU).
PADDINGS = ("longest", "buckets", "max_length")
DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512)

#: How ``seqcls_model`` (python-onnxruntime) runs the requests of one dynamic batch.
#: - ``per-request``: one ORT run per request, no cross-request padding;
#: - ``group-by-length``: requests of the same length (e.g. ``buckets``) concatenated into one run;
#: - ``pad-to-longest``: all padded to the batch's longest and run once (GPU style);
#: - ``per-text``: every text (row) runs unpadded at its own length, equal lengths share a run (CPU default).
BATCHINGS = ("per-request", "group-by-length", "pad-to-longest", "per-text")

#: ONNX Runtime graph optimisation levels by name → Triton native backend's ``graph { level }``
#: (the python runtime maps the same names to ``ort.GraphOptimizationLevel``).
GRAPH_LEVELS = {"disable": 0, "basic": 1, "extended": 2, "all": -1}

#: The per-release file each published version carries (labels, thresholds, vocabulary facts).
RELEASE_FILE = "release.json"

#: The longest text (UTF-8 bytes) the tokenizer accepts. A longer text fails its own request with
#: ``INVALID_ARG`` (never truncated silently; the rest of the dynamic batch is answered). A
#: version's ``release.json`` may set its own under :data:`MAX_TEXT_BYTES_KEY`; 64 KiB is far
#: beyond any ``max_length`` (4096 tokens) yet keeps one request from tying up a tokenizer stub.
MAX_TEXT_BYTES = 64 * 1024
MAX_TEXT_BYTES_KEY = "max_text_bytes"
