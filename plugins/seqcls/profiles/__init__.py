"""Serving profiles: what ``convert`` turns the exported ONNX graph into before it is gated and served.

``fp32`` serves the converted graph as it is; ``fp32-fused`` (offline fusion, :mod:`.fusion`) and
``int8`` (:mod:`.quantize`, checked on :mod:`.calibration`'s texts) go through
:func:`seqcls.profiles.optimize.optimize_onnx`, the one entry point ``convert`` calls.
:mod:`.checks` holds what every profile is checked against; :mod:`.node_roles` names the graph's
parts an INT8 recipe keeps in fp32.
"""
