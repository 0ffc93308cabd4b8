"""A trained checkpoint as data: its record and readers, its snapshot, its pickles, its golden texts.

:mod:`.checkpoint` (the :class:`~seqcls.checkpoints.checkpoint.Checkpoint` record and the readers every
framework's checks share), :mod:`.snapshot` (a release's own copy of the checkpoint, hashed as it is
copied: all a release reads), :mod:`.safeload` (pickles refused without unpickling), :mod:`.golden`
(the golden texts a release is gated on). The intake that runs the checks in order is
:mod:`seqcls.release.intake`; the checks that differ by framework are the adapters'
(:mod:`seqcls.frameworks`).
"""
