"""Checkpoint intake: find, check and fingerprint a trained checkpoint before any heavy work.

:mod:`.checkpoint` (the :class:`~seqcls.checkpoints.checkpoint.Checkpoint` and its files),
:mod:`.safeload` (pickles refused without unpickling), :mod:`.completion` (the training job's
completion marker and ``latest``), :mod:`.golden` (the built-in golden texts).
"""
