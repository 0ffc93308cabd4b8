"""The quality gate: a retrained model worse than the served champion on the same labeled texts never goes live.

:mod:`.evalset` (the labeled texts: PaddleNLP's ``text<TAB>label,label`` or JSON Lines, read once and
hashed), :mod:`.metrics` (micro/macro/sample, per-label, per-level and hierarchical F of one model's
decisions; the bad cases), :mod:`.rules` (floors, change rules against the champion, the profile
rule against the fp32 graph, and the :class:`~seqcls.quality.rules.Verdict`) are pure Python and
NumPy; :mod:`.scoring` runs the served graphs that produce the decisions they score.
"""
