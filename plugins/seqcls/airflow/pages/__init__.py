"""The HTML of the seqcls pages the API server shows (:mod:`.app` serves them).

Plain functions from what the release left on disk (the gates' evidence, the serving history) to a
server-rendered page: no Airflow import, no script, inline CSS only, so each page is tested as a
string and renders the same in an air-gapped API server.

- :mod:`~seqcls.airflow.pages.app` — the FastAPI app the plugin mounts under ``/seqcls`` (access, routes);
- :mod:`~seqcls.airflow.pages.kit` — the shared head (CJK-capable font stack), links bar, verdict box;
- :mod:`~seqcls.airflow.pages.parity` — the parity gate's page;
- :mod:`~seqcls.airflow.pages.quality` — the quality gate's page;
- :mod:`~seqcls.airflow.pages.history` — a model's serving history, and the list of models.
"""
