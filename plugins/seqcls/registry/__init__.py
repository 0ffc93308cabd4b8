"""MLflow: the model registry as the release ledger (:mod:`.ledger`), the release runs and their
evidence (:mod:`.runs`), and the pyfunc model logged with each version (:mod:`.pyfunc`)."""
