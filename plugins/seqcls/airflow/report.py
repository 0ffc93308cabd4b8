"""What a release task tells: a step's outcome as a log story, the small dict it returns to XCom, and
the URLs it pushes for the UI's extra links — and, in the API server, reading a pushed value back.

The extra links (:mod:`seqcls.airflow.plugin`) and the parity page (:mod:`seqcls.airflow.pages.app`)
read what the tasks pushed under :data:`MLFLOW_URL_KEY` / :data:`TRITON_URL_KEY` / ``return_value``
through :func:`pushed_value`, so both sides of that contract live here.

Imports nothing from Airflow at module level: the heavy tasks report from another interpreter
(``@task.external_python``), where Airflow may not be installed.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqcls.contract.names import ModelName
from seqcls.registry.ledger import model_version_url
from seqcls.settings import DEFAULT_MODEL_NAME, Settings

if TYPE_CHECKING:
    from airflow.sdk.types import TaskInstanceKey

log = logging.getLogger("seqcls.airflow")

#: XCom keys holding URLs the UI shows as task extra links (see ``seqcls.airflow.plugin``).
MLFLOW_URL_KEY = "seqcls_mlflow_url"
TRITON_URL_KEY = "seqcls_triton_url"


def _figure(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None if value is None else str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and len(value) <= 80:
        return value
    return None


def step_links(result, settings: Settings, model_name: str | None = None) -> dict[str, str]:
    """XCom key → URL for the UI's extra links (MLflow model version, Triton model version)."""
    version = result.summary.get("version")
    model_name = model_name or result.summary.get("model_name") or DEFAULT_MODEL_NAME
    urls: dict[str, str | None] = {}
    if result.step in ("register", "promote"):
        urls[MLFLOW_URL_KEY] = mlflow_version_url(settings, model_name, version)
    elif result.step in ("publish", "reload", "smoke", "expose"):  # the steps that name a Triton version
        urls[TRITON_URL_KEY] = triton_model_url(settings, model_name, version)
    return {k: v for k, v in urls.items() if v}


def report(
    result,
    *,
    ti=None,
    settings: Settings | None = None,
    logger: logging.Logger | None = None,
    model_name: str | None = None,
) -> dict:
    """Log a step's outcome as a short story; return the small dict a task pushes to XCom.

    With the task instance ``ti`` and ``settings``, also push the URLs the plugin's extra links
    show (:func:`step_links`) for ``model_name``'s Triton models.
    """
    logger = logger or log
    logger.info("%s", result.line())
    figures = {k: v for k, v in result.summary.items() if _figure(v) is not None}
    if figures:
        logger.info("%s figures: %s", result.step, ", ".join(f"{k}={_figure(v)}" for k, v in figures.items()))
    root = Path(result.workspace)
    if result.outputs:
        sizes = []
        for rel in list(result.outputs)[:8]:
            p = root / rel
            size = p.stat().st_size if p.is_file() else 0
            sizes.append(f"{rel} ({size / 1e6:.2f} MB)" if size >= 10_000 else rel)
        more = f" and {len(result.outputs) - 8} more" if len(result.outputs) > 8 else ""
        logger.info("%s artifacts in %s: %s%s", result.step, root, ", ".join(sizes), more)
    else:
        logger.info("%s workspace: %s", result.step, root)
    if ti is not None and settings is not None:
        for key, url in step_links(result, settings, model_name).items():
            ti.xcom_push(key=key, value=url)
            logger.info("%s link: %s", result.step, url)
    return {
        "step": result.step,
        "status": result.status,
        "seconds": round(float(result.seconds), 3),
        "message": result.message,
        "workspace": str(root),
        **{k: v for k, v in figures.items() if not isinstance(v, str) or len(v) <= 200},
    }


def triton_model_url(settings: Settings, model_name: str, version: int | None) -> str | None:
    """Triton's HTTP metadata URL for ``model_name``'s ensemble at ``version`` (first endpoint), if known."""
    if not version or not settings.triton_http:
        return None
    model = ModelName(model_name).names.ensemble
    host = settings.triton_http[0]
    base = host if host.startswith(("http://", "https://")) else f"http://{host}"
    return f"{base.rstrip('/')}/v2/models/{model}/versions/{version}"


def mlflow_version_url(settings: Settings, model_name: str, version: int | None) -> str | None:
    if not version:
        return None
    return model_version_url(settings, model_name, version)


def configure_logging() -> None:
    """In an external interpreter nothing configures logging: send INFO to stdout (the task log)."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")


def pushed_value(ti_key: TaskInstanceKey, key: str) -> Any:
    """The XCom ``key`` the task instance pushed (None without one), read from the metadata database.

    The one place seqcls touches Airflow internals. A global link runs in the API server, where the
    Task SDK's ``XCom`` cannot work (it talks to a task supervisor; apache/airflow#59093), and Airflow
    3.3 has no public server-side XCom reader yet (proposed: apache/airflow#68789). Until then this is
    what Airflow's maintainers suggest for plugin-registered links: ``XComModel`` in a session.
    """
    from airflow.models.xcom import XComModel  # Airflow's ORM: only in the API server, when a link is asked for
    from airflow.utils.session import create_session

    query = XComModel.get_many(
        key=key,
        run_id=ti_key.run_id,
        dag_ids=ti_key.dag_id,
        task_ids=ti_key.task_id,
        map_indexes=ti_key.map_index,
        limit=1,
    ).with_only_columns(XComModel.value)
    with create_session() as session:
        value = session.scalar(query)
    if isinstance(value, str):
        try:
            return json.loads(value)  # stored JSON-encoded by the task's xcom_push
        except ValueError:
            return value
    return value


__all__ = [
    "MLFLOW_URL_KEY",
    "TRITON_URL_KEY",
    "configure_logging",
    "mlflow_version_url",
    "pushed_value",
    "report",
    "step_links",
    "triton_model_url",
]
