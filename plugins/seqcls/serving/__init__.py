"""Everything about serving on Triton: the rendered repository, the client, the recorded state."""
