"""Gates: the two numbers a release must pass — parity (what is served answers as what was trained) and
quality (the candidate is no worse than the champion on the same labeled texts).

Parity: :mod:`.parity` (the comparison maths: tolerances, ids, logits, decisions), :mod:`.parity_plot`.
Quality: :mod:`.evalset` (the labeled texts: PaddleNLP's ``text<TAB>label,label`` or JSON Lines, read
once and hashed), :mod:`.metrics` (micro/macro/sample, per-label, per-level and hierarchical F; the bad
cases), :mod:`.rules` (floors, change rules against the champion, the profile rule, the verdict),
:mod:`.paired` (the paired bootstrap that tells a real drop from the eval set's noise),
:mod:`.scoring` (labeled texts through a served graph), :mod:`.quality_plot`. Pure computation over
what the floors below provide; the steps orchestrate them.
"""
