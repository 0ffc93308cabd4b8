"""What every seqcls python model does with Triton's python backend, written once.

Shipped beside each python model's ``model.py`` (``seqcls.serving.shipped.SHIPPED_WITH``): a
per-request error response (so one bad request fails only itself), the traceback of an
unexpected exception in Triton's log, and a string parameter of the model config.
"""

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

    Why here: the server, not a client, sees every text a version answers. Counters are added
    once per ``execute`` (one call per series, not per text) to keep the stub's messages to the
    server few; the histogram is observed per text. Metrics never fail a request: if the backend
    has no metrics API, or a call fails, the model keeps answering and says so once in Triton's log.
    Per-label series are bounded: labels outside ``metric_labels`` are counted under the other-label.
    """

    def __init__(self, contract, model, version, labels=(), metric_labels=None, enabled=True):
        self.contract = contract
        self.base = {"model": str(model), "version": str(version)}
        keep = set(labels if metric_labels is None else metric_labels)
        self.series_of = {lbl: (lbl if lbl in keep else contract.OTHER_LABEL) for lbl in labels}
        self.described = {
            contract.METRIC_TEXTS: "Texts decided",
            contract.METRIC_LABEL_PREDICTIONS: "Texts predicted with the label",
            contract.METRIC_UNLABELED: "Texts with no label above its threshold",
            contract.METRIC_NEAR_THRESHOLD: "Texts with the label's probability near its threshold",
            contract.METRIC_TOP_CONFIDENCE: "Highest label probability per text",
            contract.METRIC_TOKENIZED: "Texts tokenized",
            contract.METRIC_TRUNCATED: "Texts truncated at max_length",
            contract.METRIC_REJECTED: "Requests refused, by reason",
        }
        self.families = {}
        self.metrics = {}
        self.enabled = bool(enabled) and hasattr(pb_utils, "MetricFamily")
        if enabled and not self.enabled:
            _log_warn("this python backend has no MetricFamily: seqcls metrics are off")

    def _family(self, name, kind):
        family = self.families.get(name)
        if family is None:
            family = pb_utils.MetricFamily(name=name, description=self.described[name], kind=kind)
            self.families[name] = family
        return family

    def _metric(self, name, kind, **labels):
        key = (name, tuple(sorted(labels.items())))
        metric = self.metrics.get(key)
        if metric is None:
            family = self._family(name, kind)
            if kind == pb_utils.MetricFamily.HISTOGRAM:
                metric = family.Metric(labels={**self.base, **labels}, buckets=list(self.contract.CONFIDENCE_BUCKETS))
            else:
                metric = family.Metric(labels={**self.base, **labels})
            self.metrics[key] = metric
        return metric

    def count(self, name, value, **labels):
        """Add ``value`` to the counter ``name`` of this version (with extra ``labels``)."""
        if not self.enabled or value <= 0:
            return
        try:
            self._metric(name, pb_utils.MetricFamily.COUNTER, **labels).increment(float(value))
        except Exception:
            self._fail()

    def declare(self, name, **labels):
        """Create a counter at 0 so the series exists (a rate of 0 is data; a missing series is not)."""
        if not self.enabled:
            return
        try:
            self._metric(name, pb_utils.MetricFamily.COUNTER, **labels)
        except Exception:
            self._fail()

    def observe(self, name, values):
        """Observe each of ``values`` in the histogram ``name`` of this version."""
        if not self.enabled:
            return
        try:
            metric = self._metric(name, pb_utils.MetricFamily.HISTOGRAM)
            for v in values:
                metric.observe(float(v))
        except Exception:
            self._fail()

    def tally(self, counted, labels):
        """Export one postprocess batch's :func:`seqcls_decide.tally`."""
        c = self.contract
        self.count(c.METRIC_TEXTS, counted["texts"])
        self.count(c.METRIC_UNLABELED, counted["unlabeled"])
        per_series = {}
        for label, n in counted["labels"].items():
            series = self.series_of.get(label, c.OTHER_LABEL)
            per_series[series] = per_series.get(series, 0) + n
        for series, n in per_series.items():
            self.count(c.METRIC_LABEL_PREDICTIONS, n, label=series)
        near = {}
        for i, n in enumerate(counted["near"]):
            if n:
                series = self.series_of.get(labels[i], c.OTHER_LABEL)
                near[series] = near.get(series, 0) + int(n)
        for series, n in near.items():
            self.count(c.METRIC_NEAR_THRESHOLD, n, label=series)
        self.observe(c.METRIC_TOP_CONFIDENCE, counted["top"])

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
        self.observe(c.METRIC_TOP_CONFIDENCE, ())

    def _fail(self):
        if self.enabled:
            self.enabled = False
            log_unexpected("seqcls metrics: exporting failed; metrics are off for this model instance")


def _log_warn(message):
    log_warn = getattr(getattr(pb_utils, "Logger", None), "log_warn", None)
    if log_warn is not None:
        log_warn(message)
