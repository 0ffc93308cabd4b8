"""The project's own local Triton Inference Server (``seqcls triton start|stop|status``).

The ``tritonserver`` binary of the nvidia-pytriton wheel, run detached in its own session with
its pid, state and log in a ``state_dir``, so any later process can find, query and stop it.

- :mod:`~seqcls.localtriton.config`: :class:`TritonServerConfig` (ports, loopback, options; the
  command line);
- :mod:`~seqcls.localtriton.distribution`: the wheel's server, libpython, the prepared copy;
- :mod:`~seqcls.localtriton.ports`: free ports, busy-port errors;
- :mod:`~seqcls.localtriton.process`: process group, signals, waits, shared-memory cleanup;
- :mod:`~seqcls.localtriton.health`: liveness probes, startup failures from the log;
- :mod:`~seqcls.localtriton.server`: :class:`LocalTriton` start/stop/status and its state files.
"""

from seqcls.localtriton.config import DEFAULT_SHM_DEFAULT_BYTE_SIZE, DEFAULT_SHM_GROWTH_BYTE_SIZE, TritonServerConfig
from seqcls.localtriton.distribution import TritonDistribution, find_libpython, prepare_server
from seqcls.localtriton.health import wait_until_live
from seqcls.localtriton.ports import free_port, free_ports
from seqcls.localtriton.server import LocalTriton, TritonStatus

__all__ = [
    "DEFAULT_SHM_DEFAULT_BYTE_SIZE",
    "DEFAULT_SHM_GROWTH_BYTE_SIZE",
    "LocalTriton",
    "TritonDistribution",
    "TritonServerConfig",
    "TritonStatus",
    "find_libpython",
    "free_port",
    "free_ports",
    "prepare_server",
    "wait_until_live",
]
