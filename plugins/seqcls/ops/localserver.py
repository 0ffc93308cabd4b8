"""The local Triton's config for the configured repository, on a directory or on an object store.

Why here and not in :mod:`seqcls.localtriton`: on an ``s3://`` repository the server must read the store, in
Triton's form of its URI with the credentials in its environment (:func:`seqcls.serving.s3repo.triton_repository`),
and ``localtriton`` sits beside ``serving`` (neither imports the other).
"""

from __future__ import annotations

from seqcls.localtriton import TritonServerConfig
from seqcls.serving.objectstore import S3Location
from seqcls.serving.s3repo import triton_repository
from seqcls.settings import Settings, aws_s3_environment


def local_triton_config(settings: Settings) -> TritonServerConfig:
    """The local server's config for ``settings``. On an ``s3://`` repository Triton reads the store itself:
    ``settings.triton_repository`` is then this host's working copy, which a Triton started on it would take
    for the repository (serving whatever this host happens to hold, not the store)."""
    if settings.triton_store is None:
        return TritonServerConfig.from_settings(settings)
    triton = triton_repository(S3Location.parse(settings.triton_store, environment=aws_s3_environment()))
    return TritonServerConfig.from_settings(settings, repository=triton.uri, environment=dict(triton.environment))


__all__ = ["local_triton_config"]
