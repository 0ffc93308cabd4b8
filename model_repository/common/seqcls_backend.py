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
