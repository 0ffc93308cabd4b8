"""Serving on Triton: the rendered repository, the one client, the recorded state and its log, the
release lease, reconcile, Triton's metrics, and a published version read back for scoring."""
