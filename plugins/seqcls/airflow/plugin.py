"""The ``seqcls`` Airflow plugin: task extra links to the MLflow model version and the Triton model.

Registered through the ``airflow.plugins`` entry point of the installed ``seqcls`` distribution
(``pyproject.toml``), not through a plugins folder: ``airflow plugins`` lists it as ``seqcls`` with
source ``seqcls==<version>: EntryPoint(...)``. (The repository's ``plugins/`` directory is the
package's source tree; its ``.airflowignore`` keeps a plugins-folder scan of it from executing the
modules as top-level files.)

Airflow 3 computes a *global* extra link in the API server, for every task, by calling
``get_link``; the seqcls tasks push the URLs themselves to XCom (keys
:data:`seqcls.airflow.report.MLFLOW_URL_KEY` / :data:`~seqcls.airflow.report.TRITON_URL_KEY`), so a link
reads that XCom (:func:`~seqcls.airflow.report.pushed_value`), and is empty (hidden) for tasks that
pushed nothing. ``register_model``/``promote`` push the MLflow URL (only when MLflow is an http(s)
server — a sqlite store has no UI), ``publish_repository``/``reload_triton``/``smoke_test``/
``expose_version`` push Triton's HTTP metadata URL of the served ensemble version. The two gates'
evidence links (``validate_parity``'s *Parity evidence*, ``evaluate_quality``'s *Quality evidence*)
need no XCom: a refused gate pushes none, so their URL is computed from the task instance's key.

The pages also sit where people look (Airflow 3's ``external_views``): each DAG run has the tabs
*Parity evidence* and *Quality evidence* (the page in the run's view; destination ``dag_run``, the
run's ids filled in by the UI), and the *Browse* menu has *Release history*
(``/seqcls/history``: every model's serving changes, :mod:`seqcls.airflow.pages.app`).
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import unquote

from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseOperatorLink

from seqcls.airflow.pages.app import URL_PREFIX, create_app, evidence_path, history_path, quality_path
from seqcls.airflow.report import MLFLOW_URL_KEY, TRITON_URL_KEY, pushed_value
from seqcls.steps import BY_NAME

VALIDATE_TASK = BY_NAME["validate"].task_id
EVALUATE_TASK = BY_NAME["evaluate"].task_id

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


def api_base() -> str:
    """``[api] base_url`` without its trailing slash ("" when unset): what the UI's own URLs start with."""
    return (conf.get("api", "base_url", fallback="") or "").rstrip("/")


def external_views(base: str) -> list[dict[str, str]]:
    """The UI entries (Airflow 3 ``external_views``): the gates' pages as tabs of every DAG run (the UI
    fills ``{DAG_ID}``/``{RUN_ID}``; a run without seqcls evidence answers 404 with why), the history
    in the *Browse* menu."""
    run = "{DAG_ID}/{RUN_ID}"
    return [
        {"name": "Parity evidence", "href": f"{base}{URL_PREFIX}/parity/{run}", "destination": "dag_run",
         "url_route": "seqcls-parity"},
        {"name": "Quality evidence", "href": f"{base}{URL_PREFIX}/quality/{run}", "destination": "dag_run",
         "url_route": "seqcls-quality"},
        {"name": "Release history", "href": f"{base}{history_path()}", "destination": "nav", "category": "browse",
         "url_route": "seqcls-history"},
    ]  # fmt: skip


class _XComUrlLink(BaseOperatorLink):
    """A link whose URL a task pushed to XCom under :attr:`xcom_key`."""

    key = ""

    @property
    def xcom_key(self) -> str:
        return self.key

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        url = pushed_value(ti_key, self.xcom_key)
        return url if isinstance(url, str) and url.startswith(("http://", "https://")) else ""


class MlflowModelVersionLink(_XComUrlLink):
    name = "MLflow model version"
    key = MLFLOW_URL_KEY


class TritonModelLink(_XComUrlLink):
    """The Triton version the task published or served — while Triton still has it loaded; an old run's
    version that is gone (rolled back, replaced, unloaded) links to the model's history instead, which
    says what happened to it and what is served now."""

    name = "Triton model"
    key = TRITON_URL_KEY

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        url = super().get_link(operator, ti_key=ti_key)
        found = VERSIONED.search(url) if url else None
        if found is None or version_ready(url) is not False:  # unknown (Triton down): the link as pushed
            return url
        return f"{api_base()}{history_path(unquote(found.group('model')))}"


#: ``…/v2/models/<model>/versions/<n>``: the metadata URL a task pushes for one Triton version.
VERSIONED = re.compile(r"/v2/models/(?P<model>[^/]+)/versions/(?P<version>\d+)$")
#: How long the API server waits for Triton when it renders a link (a down Triton must not stall the UI).
READY_TIMEOUT_S = 1.0


def version_ready(url: str) -> bool | None:
    """Whether Triton answers ``<url>/ready`` with 200 (True), another status (False), or not at all (None)."""
    try:
        with urllib.request.urlopen(f"{url}/ready", timeout=READY_TIMEOUT_S) as answer:
            return answer.status == 200
    except urllib.error.HTTPError:
        return False
    except (urllib.error.URLError, OSError, ValueError):
        return None


class _EvidenceLink(BaseOperatorLink):
    """A gate's evidence page (:mod:`seqcls.airflow.pages.app`), on :attr:`task_id` only, passed or failed.

    Computed from the ti_key alone (a failed gate pushes no XCom). The UI opens an extra link as an
    ``<a href>``, so a path resolves against the API server the UI came from; with ``[api] base_url``
    set (a sub-path deployment) the URL is absolute under it.
    """

    task_id = ""

    def page(self, dag_id: str, run_id: str) -> str:
        """The gate's page for the run (each subclass names its own)."""
        raise NotImplementedError

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        if ti_key.task_id != self.task_id:
            return ""
        return f"{api_base()}{self.page(ti_key.dag_id, ti_key.run_id)}"


class ParityEvidenceLink(_EvidenceLink):
    """``validate_parity``'s parity gate: outcome, report figures, plot, MLflow run."""

    name = "Parity evidence"
    task_id = VALIDATE_TASK

    def page(self, dag_id: str, run_id: str) -> str:
        return evidence_path(dag_id, run_id)


class QualityEvidenceLink(_EvidenceLink):
    """``evaluate_quality``'s quality gate: verdict, candidate vs champion, eval set, plot, bad cases."""

    name = "Quality evidence"
    task_id = EVALUATE_TASK

    def page(self, dag_id: str, run_id: str) -> str:
        return quality_path(dag_id, run_id)


class SeqclsPlugin(AirflowPlugin):
    """Extra links for the seqcls release tasks, the pages they point at, and those pages in the UI."""

    name = "seqcls"
    global_operator_extra_links: ClassVar[list] = [
        MlflowModelVersionLink(),
        TritonModelLink(),
        ParityEvidenceLink(),
        QualityEvidenceLink(),
    ]
    fastapi_apps: ClassVar[list] = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "seqcls"}]
    external_views: ClassVar[list] = external_views(api_base())


__all__ = [
    "MlflowModelVersionLink",
    "ParityEvidenceLink",
    "QualityEvidenceLink",
    "SeqclsPlugin",
    "TritonModelLink",
    "api_base",
    "external_views",
]
