"""Gates: the numbers a release must pass before it is registered (parity today)."""
