"""One release of one checkpoint: its intake, its workspace and records, its key, and the serving change.

- :mod:`.intake` — the checkpoint checked in order, fingerprinted, taken into its workspace's snapshot
  (the ``resolve`` step), and reopened by later tasks; :mod:`.completion` — the training job's completion
  marker and ``latest``; :mod:`.kept` — the eval set kept at resolve;
- :mod:`.workspace` — the workspace and its manifest (every step restartable and idempotent);
- :mod:`.records` — the typed records steps hand each other through the workspace;
- :mod:`.keys` — the release key and what every published version's ``release.json`` holds;
- :mod:`.control` — changing what is served: the lease, then the recorded state, then reconcile.
"""
