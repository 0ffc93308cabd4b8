"""One exception tree for the whole release pipeline.

::

    SeqclsError                 anything seqcls raises on purpose
     ├── InputError             the user's input is wrong: fix the file / param named in the message
     │    └── CheckpointError   a checkpoint directory is incomplete or inconsistent
     ├── StepOrderError         a step ran before the step it needs (run the named step first)
     ├── ConversionError        export or ONNX conversion produced something unusable
     ├── GateError              the parity gate refused the model (report path in the message)
     ├── ServingError           Triton: start, publish, load, readiness, smoke
     │    ├── SmokeError        the served model answered differently than validated
     │    └── LeaseError        another release of the model holds the release lease
     └── RegistryError          MLflow tracking / model registry

Every message names the artifact, what was observed and what to do next. Airflow tasks let
these propagate so the task fails with that message as its last log line.
"""

from __future__ import annotations


class SeqclsError(Exception):
    """Root of every error seqcls raises deliberately."""


class InputError(SeqclsError):
    """User input (a file, a parameter, a setting) is wrong; the message says which and why."""


class CheckpointError(InputError):
    """A checkpoint directory cannot be released as it is."""


class StepOrderError(SeqclsError):
    """A step needs the output of an earlier step that has not run for this workspace."""


class ConversionError(SeqclsError):
    """Export or conversion finished but its output is missing, empty or inconsistent."""


class GateError(SeqclsError):
    """The parity gate failed; nothing downstream may use this model."""


class ServingError(SeqclsError):
    """Triton refused, failed or timed out; the message carries the server's own words."""


class SmokeError(ServingError):
    """The served ensemble's answers differ from the validated ones."""


class LeaseError(ServingError):
    """Another release of the same model holds the release lease (the message names the holder)."""


class RegistryError(SeqclsError):
    """MLflow tracking or the model registry failed or is inconsistent."""


class ResourceError(SeqclsError):
    """A resource ran out (disk full, quota): the message names the path and what is free there."""


__all__ = [
    "CheckpointError",
    "ConversionError",
    "GateError",
    "InputError",
    "LeaseError",
    "RegistryError",
    "ResourceError",
    "SeqclsError",
    "ServingError",
    "SmokeError",
    "StepOrderError",
]
