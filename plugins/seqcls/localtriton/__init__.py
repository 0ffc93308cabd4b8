"""The project's own local Triton Inference Server (``seqcls triton start|stop|status``)."""

from seqcls.localtriton.server import (
    DEFAULT_SHM_DEFAULT_BYTE_SIZE,
    DEFAULT_SHM_GROWTH_BYTE_SIZE,
    LocalTriton,
    TritonDistribution,
    TritonServerConfig,
    TritonStatus,
    find_libpython,
    free_port,
    free_ports,
    prepare_server,
    wait_until_live,
)

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
