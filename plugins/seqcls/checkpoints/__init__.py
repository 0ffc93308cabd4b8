"""Checkpoint intake: find, check and fingerprint a trained checkpoint before any heavy work.

:mod:`.resolve` (the intake: checks in order, fingerprint), :mod:`.snapshot` (a release's own copy
of the checkpoint, hashed as it is copied: all a release reads), :mod:`.checkpoint` (the
:class:`~seqcls.checkpoints.checkpoint.Checkpoint` record and the readers every framework's checks
share), :mod:`.safeload` (pickles refused without unpickling), :mod:`.completion` (the training
job's completion marker and ``latest``), :mod:`.golden` (the golden texts a release is gated on).
The checks that differ by framework are the adapters' (:mod:`seqcls.frameworks`).
"""
