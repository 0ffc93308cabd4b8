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
so a dead replica is visible in the grid. Uses the same `triton_default` / `mlflow_default`
Connections as `seqcls_release`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import dag, task

SYNC_EVERY = timedelta(minutes=5)


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
        from seqcls.airflow import sync_task

        return sync_task(params)

    sync_models()


seqcls_sync()
