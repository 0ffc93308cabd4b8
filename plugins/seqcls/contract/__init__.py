"""The served contract: what every floor above agrees on about a published model, and nothing else.

- :mod:`.names` — a model name, validated once into :class:`~seqcls.contract.names.ServingNames`, the
  value that carries every Triton name derived from it;
- :mod:`.shipped` — the self-contained modules ``model_repository/`` ships into Triton, as seqcls
  imports them (one implementation: the gates run the code Triton runs);
- :mod:`.runtime` — running a served graph outside Triton: ONNX Runtime sessions and the serving padding.
"""
