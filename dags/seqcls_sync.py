"""
# seqcls_sync — keep every Triton endpoint (and MLflow's champion) on the recorded serving state

Every 5 minutes, `seqcls sync` for every model with a recorded state in the shared model
repository: a Triton that restarted (explicit model control comes back empty), an endpoint that
missed a switch, a candidate left by a killed release, a champion alias that lagged behind an
MLflow outage — all converge to what the last release or rollback recorded. Idempotent and cheap
when nothing is off (readiness checks only), so a short schedule costs little; a restarted
Triton is serving again within minutes without waiting for the next release. Why a DAG and not
a task in `seqcls_release`: recovery must not depend on a release being triggered (scheduled
release runs skip when the checkpoint already is champion).

The run fails (and says which endpoint or registry call) when an endpoint is still unreachable,
so a dead replica is visible in the grid. Without a models file: every model of the
`triton_default` repository, mirrored to `mlflow_default`. With one (the release DAGs' file, see
`seqcls.airflow.models_file`): every repository its models' `triton_conn_id`s name, each model's
champion mirrored through its own `mlflow_conn_id` (`seqcls.airflow.models_file.sync_groups`). A
models file that does not parse fails the release DAGs, not this one: recovery then falls back
to the default Connections.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import dag, task

from seqcls.airflow.models_file import release_models, sync_groups
from seqcls.errors import InputError

SYNC_EVERY = timedelta(minutes=5)


def _groups() -> list[dict]:
    try:
        return sync_groups(release_models(Path(__file__).resolve().parent))
    except InputError as exc:  # the release DAGs show this error; recovery keeps working
        logging.getLogger(__name__).error("models file not used by seqcls_sync: %s", exc)
        return sync_groups(())


GROUPS = _groups()


@dag(
    dag_id="seqcls_sync",
    schedule=SYNC_EVERY,
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    default_args={"retries": 0, "execution_timeout": timedelta(minutes=20)},
    tags=["seqcls", "triton", "mlflow", "recovery"],
)
def seqcls_sync():
    @task
    def sync_models(params=None) -> list[dict]:
        """Reconcile every model's endpoints and champion to its recorded serving state."""
        from seqcls.airflow.tasks import sync_task

        return sync_task(params, GROUPS)

    sync_models()


seqcls_sync()
