"""What the served model predicts over time: the release's reference distribution, the live
counts the serving models export on Triton's ``/metrics``, and the drift between them."""
