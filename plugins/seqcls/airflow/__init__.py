"""The Airflow shell around the seqcls library: DAG params → library objects, the task bodies, the UI.

- :mod:`~seqcls.airflow.context` — the task table, params → Settings/ReleaseConfig, the run's release
  (no Airflow import: the heavy tasks run it in another interpreter)
- :mod:`~seqcls.airflow.tasks` — what each task does (the policy a run follows)
- :mod:`~seqcls.airflow.report` — a step's story, its XCom summary and link URLs
- :mod:`~seqcls.airflow.roots` — where a run may take its checkpoint from
- :mod:`~seqcls.airflow.models_file`, :mod:`~seqcls.airflow.params`, :mod:`~seqcls.airflow.assets` —
  what the DAG file builds (one DAG per model, its trigger form, its Assets)
- :mod:`~seqcls.airflow.hooks`, :mod:`~seqcls.airflow.provider` — the
  Connections (hooks, the *Test* button, the provider metadata)
- :mod:`~seqcls.airflow.plugin`, :mod:`~seqcls.airflow.pages` — the extra links and the evidence pages

Import from the modules; this package itself imports nothing, so ``seqcls.airflow.context`` stays
importable without Airflow.
"""
