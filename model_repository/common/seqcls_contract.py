"""The serving contract: every name and enum that both seqcls and the Triton models use, once.

Shipped next to each python model's ``model.py`` (Triton has no ``seqcls`` package) and
imported by the library through :mod:`seqcls.contract.shipped`, so the renderer, the smoke test
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

#: What the serving models export on Triton's ``/metrics`` (python backend custom metrics), so the
#: operator sees *what* a version answers, not only how fast. Every series carries ``model`` (the
#: seqcls model name, ``release.json``'s ``model_name``) and ``version`` (the Triton version).
#: Counters: texts decided, per label (after the hierarchy rule), with no label, near a threshold;
#: texts tokenized / truncated at ``max_length``; requests refused, by a bounded ``reason``.
#: Histogram series (``_bucket{le}``, ``_sum``, ``_count``): the top label's confidence per text.
METRIC_TEXTS = "seqcls_texts_total"
METRIC_LABEL_PREDICTIONS = "seqcls_label_predictions_total"
METRIC_UNLABELED = "seqcls_unlabeled_texts_total"
METRIC_NEAR_THRESHOLD = "seqcls_near_threshold_total"
METRIC_TOP_CONFIDENCE = "seqcls_top_confidence"
METRIC_TOKENIZED = "seqcls_tokenized_texts_total"
METRIC_TRUNCATED = "seqcls_truncated_texts_total"
METRIC_REJECTED = "seqcls_rejected_requests_total"
#: How often the python models hand their metric sums to Triton: a scrape sees a text at most this late.
METRICS_FLUSH_SECONDS = 1.0
#: Upper bounds of the top-confidence histogram: dense where sigmoid decisions are made (around
#: the usual 0.5 threshold) and near certainty, where a healthy model's mass sits.
CONFIDENCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999)
#: A probability within this distance of its label's threshold counts as "near threshold".
NEAR_THRESHOLD_MARGIN = 0.1
#: ``reason`` values of :data:`METRIC_REJECTED` (a fixed set: free-form reasons would be unbounded).
REJECT_REASONS = ("missing_input", "not_bytes", "invalid_utf8", "too_long", "tokenize_failed", "bad_logits", "internal")
#: Per-label series are bounded: at most this many labels get their own ``label`` value per
#: version; the rest are summed under :data:`OTHER_LABEL`. Which ones: ``release.json``'s
#: :data:`METRIC_LABELS_KEY` (the most frequent in the release's reference distribution).
MAX_LABEL_SERIES = 200
OTHER_LABEL = "__other__"
METRIC_LABELS_KEY = "metric_labels"
#: ``release.json`` key of the release's reference distribution (what the served graph predicted on
#: the eval set, or the golden texts): the baseline ``seqcls monitor`` compares live traffic with.
REFERENCE_KEY = "reference"
