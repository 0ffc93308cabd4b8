"""Gates: the numbers a release must pass before it is registered (parity today).

:mod:`.parity` (the comparison maths: tolerances, ids, logits, decisions), :mod:`.runtime` (ONNX
Runtime sessions on the served graph, and the serving padding every reference is fed with),
:mod:`.plot` (the gate's picture). The references a gate compares against are the framework
adapters' (:mod:`seqcls.frameworks`).
"""
