"""The documentation's generated parts: :mod:`.reference` renders the configuration reference from the code."""
