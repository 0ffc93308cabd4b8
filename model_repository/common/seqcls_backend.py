"""What every seqcls python model does with Triton's python backend, written once.

Shipped beside each python model's ``model.py`` (``seqcls.contract.shipped.SHIPPED_WITH``): a
per-request error response (so one bad request fails only itself), the traceback of an
unexpected exception in Triton's log, and a string parameter of the model config.
"""

import threading
import traceback

import triton_python_backend_utils as pb_utils


def param(config, key, default):
    """The model config's ``parameters[key].string_value``, ``default`` when unset or empty."""
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


def invalid(message):
    """An error response for one request: ``INVALID_ARG`` where the python backend has codes."""
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


def log_unexpected(what):
    """``what`` and the current exception's traceback, as an error in Triton's log."""
    logger = getattr(pb_utils, "Logger", None)
    if logger is not None:
        logger.log_error(f"{what}: {traceback.format_exc()}")


class Metrics:
    """The custom metrics one python model exports on Triton's ``/metrics`` (names in ``seqcls_contract``).

    Why here: the server, not a client, sees every text a version answers. Why deferred: each call
    of the metrics API is a round trip from the stub to the server process, and a few per request
    cut the served rate visibly; so ``execute`` only adds to local sums, and a background thread
    hands them to Triton every ``flush_seconds`` (and ``close`` on unload), one call per changed
    series. The top-confidence distribution is kept the same way, as cumulative bucket counters
    with ``_sum`` and ``_count`` (the series of a Prometheus histogram, so ``histogram_quantile``
    reads them). Metrics never fail a request: without a metrics API, or when a call fails, the
    model keeps answering and says so once in Triton's log. Per-label series are bounded: labels
    outside ``metric_labels`` are counted under the other-label.
    """

    def __init__(self, contract, model, version, labels=(), metric_labels=None, enabled=True, flush_seconds=None):
        self.contract = contract
        self.base = {"model": str(model), "version": str(version)}
        keep = set(labels if metric_labels is None else metric_labels)
        self.series_of = {lbl: (lbl if lbl in keep else contract.OTHER_LABEL) for lbl in labels}
        top = contract.METRIC_TOP_CONFIDENCE
        self.described = {
            contract.METRIC_TEXTS: "Texts decided",
            contract.METRIC_LABEL_PREDICTIONS: "Texts predicted with the label",
            contract.METRIC_UNLABELED: "Texts with no label above its threshold",
            contract.METRIC_NEAR_THRESHOLD: "Texts with the label's probability near its threshold",
            f"{top}_bucket": "Texts whose highest label probability is at most le (cumulative)",
            f"{top}_sum": "Sum of the highest label probability over texts",
            f"{top}_count": "Texts whose highest label probability was recorded",
            contract.METRIC_TOKENIZED: "Texts tokenized",
            contract.METRIC_TRUNCATED: "Texts truncated at max_length",
            contract.METRIC_REJECTED: "Requests refused, by reason",
        }
        self.bounds = [float(b) for b in contract.CONFIDENCE_BUCKETS]
        self.families = {}
        self.metrics = {}
        self.pending = {}
        self.lock = threading.Lock()  # guards pending (execute adds, the flusher takes)
        self.calling = threading.Lock()  # one thread at a time talks to Triton
        self.flush_seconds = float(contract.METRICS_FLUSH_SECONDS if flush_seconds is None else flush_seconds)
        self.enabled = bool(enabled) and hasattr(pb_utils, "MetricFamily")
        self.stopped = threading.Event()
        if enabled and not self.enabled:
            _log_warn("this python backend has no MetricFamily: seqcls metrics are off")
        if self.enabled and self.flush_seconds > 0:
            threading.Thread(target=self._flusher, name="seqcls-metrics", daemon=True).start()

    def _metric(self, key):
        metric = self.metrics.get(key)
        if metric is None:
            name, labels = key
            family = self.families.get(name)
            if family is None:
                kind = pb_utils.MetricFamily.COUNTER
                family = pb_utils.MetricFamily(name=name, description=self.described[name], kind=kind)
                self.families[name] = family
            metric = family.Metric(labels={**self.base, **dict(labels)})
            self.metrics[key] = metric
        return metric

    def count(self, name, value, **labels):
        """Add ``value`` to the counter ``name`` of this version (with extra ``labels``), at the next flush."""
        if not self.enabled or value <= 0:
            return
        key = (name, tuple(sorted(labels.items())))
        with self.lock:
            self.pending[key] = self.pending.get(key, 0.0) + float(value)
        if self.flush_seconds <= 0:
            self.flush()

    def declare(self, name, **labels):
        """Create a counter at 0 now, so the series exists (a rate of 0 is data; a missing series is not)."""
        if not self.enabled:
            return
        try:
            with self.calling:
                self._metric((name, tuple(sorted(labels.items()))))
        except Exception:
            self._fail()

    def flush(self):
        """Hand the sums added since the last flush to Triton (one call per changed series)."""
        if not self.enabled:
            return
        with self.lock:
            pending, self.pending = self.pending, {}
        with self.calling:  # outside the sums' lock: execute never waits for Triton
            try:
                for key, value in pending.items():
                    self._metric(key).increment(value)
            except Exception:
                self._fail()

    def _flusher(self):
        while not self.stopped.wait(self.flush_seconds):
            self.flush()

    def close(self):
        """On unload: the last sums go out, the flusher stops."""
        self.stopped.set()
        self.flush()

    def tally(self, counted, labels):
        """Export one postprocess batch's :func:`seqcls_decide.tally`."""
        c = self.contract
        if not self.enabled:
            return
        self.count(c.METRIC_TEXTS, counted["texts"])
        self.count(c.METRIC_UNLABELED, counted["unlabeled"])
        per_series = {}
        for label, n in counted["labels"].items():
            series = self.series_of.get(label, c.OTHER_LABEL)
            per_series[series] = per_series.get(series, 0) + n
        for series, n in per_series.items():
            self.count(c.METRIC_LABEL_PREDICTIONS, n, label=series)
        near = {}
        for i in counted["near"].nonzero()[0]:
            series = self.series_of.get(labels[i], c.OTHER_LABEL)
            near[series] = near.get(series, 0) + int(counted["near"][i])
        for series, n in near.items():
            self.count(c.METRIC_NEAR_THRESHOLD, n, label=series)
        top = counted["top"]
        if len(top):
            name = c.METRIC_TOP_CONFIDENCE
            for bound, n in zip(self.bounds, counted["buckets"], strict=True):
                self.count(f"{name}_bucket", n, le=_le(bound))
            self.count(f"{name}_bucket", len(top), le="+Inf")
            self.count(f"{name}_sum", float(top.sum()))
            self.count(f"{name}_count", len(top))

    def rejected(self, reason, n=1):
        reason = reason if reason in self.contract.REJECT_REASONS else "internal"
        self.count(self.contract.METRIC_REJECTED, n, reason=reason)

    def declare_postprocess(self):
        """The postprocess model's series at 0, so a version that answered nothing shows zeros."""
        c = self.contract
        for name in (c.METRIC_TEXTS, c.METRIC_UNLABELED):
            self.declare(name)
        for series in sorted(set(self.series_of.values())):
            self.declare(c.METRIC_LABEL_PREDICTIONS, label=series)
        top = c.METRIC_TOP_CONFIDENCE
        for bound in [*(_le(b) for b in self.bounds), "+Inf"]:
            self.declare(f"{top}_bucket", le=bound)
        self.declare(f"{top}_sum")
        self.declare(f"{top}_count")

    def _fail(self):
        if self.enabled:
            self.enabled = False
            self.stopped.set()
            log_unexpected("seqcls metrics: exporting failed; metrics are off for this model instance")


def _le(bound):
    """A bucket bound as Prometheus writes ``le`` (``0.5``, ``0.999``)."""
    return repr(float(bound))


def _log_warn(message):
    log_warn = getattr(getattr(pb_utils, "Logger", None), "log_warn", None)
    if log_warn is not None:
        log_warn(message)
