"""The ``seqcls`` Airflow plugin: task extra links to the MLflow model version and the Triton model.

Airflow 3 computes a *global* extra link in the API server, for every task, by calling
``get_link``; the seqcls tasks push the URLs themselves to XCom (keys
:data:`seqcls.airflow.MLFLOW_URL_KEY` / :data:`seqcls.airflow.TRITON_URL_KEY`), so a link reads
that XCom exactly as Airflow's own XCom-backed operator links do, and is empty (hidden) for tasks
that pushed nothing. ``register_model``/``promote`` push the MLflow URL (only when MLflow is an
http(s) server — a sqlite store has no UI), ``publish_repository``/``reload_triton``/
``smoke_test`` push Triton's HTTP metadata URL of the served ensemble version.

Loaded through ``plugins/seqcls_plugin.py``; ``airflow plugins`` lists it as ``seqcls``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseOperatorLink

from seqcls.airflow import MLFLOW_URL_KEY, TRITON_URL_KEY

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class _XComUrlLink(BaseOperatorLink):
    """A link whose URL a task pushed to XCom under :attr:`xcom_key`."""

    key = ""

    @property
    def xcom_key(self) -> str:
        return self.key

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        # Runs in the API server: read the XCom the way Airflow's own XCom-backed links do.
        from airflow.serialization.definitions.operatorlink import XComOperatorLink

        url = XComOperatorLink(name=self.name, xcom_key=self.xcom_key).get_link(operator, ti_key=ti_key)
        return url if url.startswith(("http://", "https://")) else ""


class MlflowModelVersionLink(_XComUrlLink):
    name = "MLflow model version"
    key = MLFLOW_URL_KEY


class TritonModelLink(_XComUrlLink):
    name = "Triton model"
    key = TRITON_URL_KEY


class SeqclsPlugin(AirflowPlugin):
    """Extra links for the seqcls release tasks."""

    name = "seqcls"
    global_operator_extra_links: ClassVar[list] = [MlflowModelVersionLink(), TritonModelLink()]


if __name__ != "seqcls.airflow.plugin":
    # Airflow's plugins-folder scan executes every .py file under plugins/ as a top-level module
    # (this one as "plugin") unless plugins/.airflowignore lists seqcls/; the plugin is registered
    # once, through plugins/seqcls_plugin.py, not a second time as a duplicate ("already registered").
    del SeqclsPlugin


__all__ = ["MlflowModelVersionLink", "SeqclsPlugin", "TritonModelLink"]
