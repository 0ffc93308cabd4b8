"""Airflow hooks for the two systems a release talks to: Triton servers and MLflow.

Each hook resolves one Connection into the arguments the seqcls library takes — the Triton
replicas (:class:`~seqcls.serving.client.Endpoint`) plus the live repository path, or a tracking
URI — and gives the real client: ``TritonHook.get_conn()`` one :class:`~seqcls.serving.client.TritonOps`
per replica (tritonclient's gRPC client behind seqcls's policy: the control key on model-control
calls only, timeouts, the one retry policy), ``MlflowHook.get_conn()`` an ``MlflowClient``. No
release logic lives here; ``test_connection()`` (the UI's *Test* button) runs the checks a release runs
at resolve (:mod:`seqcls.steps.preflight`),
except for a sqlite MLflow store: opened read-only (:func:`check_sqlite_store`), since an MLflow client
would create, migrate and lock a store just to answer *Test*.

Connection types (``seqcls.airflow.provider``: the forms; ``docker-compose.airflow.yml`` defines both)::

    triton_default  conn_type triton; host/port = one replica's gRPC address, or extras
                    grpc_endpoints  "triton-a:8001,triton-b:8001"   one per replica
                    http_endpoints  "triton-a:8000,triton-b:8000"   same order (optional)
                    repository      "/models"  the live model repository as the workers see it,
                                    or "s3://bucket/prefix" on an S3-API object store
                    store_conn_id   "aws_default"  for an s3:// repository: an AWS-type Connection —
                                    login/password = access key id/secret, extras endpoint_url,
                                    region_name, aws_session_token (Amazon's names)
                    password        Triton's model-control key
    mlflow_default  conn_type mlflow; extra tracking_uri, else schema://host:port (schema http);
                    credentials: login + password (basic auth), or a token (extra ``token``, or a
                    password without login) — never in the URI (refused: it is logged and recorded)

The hooks read the extras and fields, not the type: Connections of ``conn_type`` ``generic`` (as
before these types existed) work the same.

Credentials stay out of everything seqcls writes: every password and sensitive extra a hook reads
(``token``, ``password``, ... — Airflow's sensitive names) is registered with Airflow's secrets
masker (:func:`airflow.sdk.log.mask_secret`) the moment the Connection is read, so task logs show
``***``; MLflow gets them through its own variables (``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` /
``_TOKEN``) only while a task's MLflow work runs (:func:`seqcls.airflow.tasks.connected`), never through the
tracking URI (which the release manifest, links and logs carry). The Triton Connection's password
is the model-control key (``seqcls.settings.ENV_TRITON_CONTROL_KEY``), masked the same way. An ``s3://``
repository's credentials reach the object store the way MLflow's do: through the standard AWS
variables (:data:`seqcls.settings.AWS_CREDENTIAL_VARS`), set only while a task runs.

Resolution order: constructor arguments > Connection > ``SEQCLS_*`` environment > embedded
defaults. A Connection that does not exist is not an error: the hook logs that it falls back to
:mod:`seqcls.settings` (the local embedded setup: Triton on 127.0.0.1, MLflow on sqlite).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.sdk.log import mask_secret

from seqcls.airflow.provider import MLFLOW_CONN_TYPE, MLFLOW_NAME, TRITON_CONN_TYPE, TRITON_NAME
from seqcls.errors import InputError
from seqcls.registry.ledger import client as mlflow_client
from seqcls.serving.client import Endpoint, TritonOps, endpoints_from_settings
from seqcls.settings import (
    AWS_CREDENTIAL_VARS,
    AWS_ENDPOINT_VARS,
    AWS_REGION_VARS,
    Settings,
    check_tracking_uri,
    mlflow_credentials,
)
from seqcls.steps.preflight import check_mlflow, check_triton


def _split(value: Any) -> list[str]:
    if not value:
        return []
    if isinstance(value, list | tuple):
        return [str(v).strip() for v in value if str(v).strip()]
    return [p.strip() for p in str(value).split(",") if p.strip()]


class _SeqclsHook(BaseHook):
    """Shared: one Connection, looked up once; ``None`` (logged) when it does not exist."""

    conn_name_attr = "conn_id"
    default_conn_name = ""
    conn_type = ""
    hook_name = ""
    fallback = ""

    def __init__(self, conn_id: str | None = None) -> None:
        super().__init__()
        self.conn_id = conn_id or self.default_conn_name
        setattr(self, self.conn_name_attr, self.conn_id)  # e.g. self.triton_conn_id, provider style

    @cached_property
    def connection(self):
        """The Connection (None when not defined), its secrets registered with the masker first."""
        try:
            conn = self.get_connection(self.conn_id)
        except AirflowNotFoundException:
            self.log.info("Airflow connection %r is not defined; using %s", self.conn_id, self.fallback)
            return None
        mask_connection(conn)
        return conn

    @property
    def extra(self) -> dict[str, Any]:
        conn = self.connection
        return dict(conn.extra_dejson) if conn is not None else {}

    def test_connection(self) -> tuple[bool, str]:
        """The UI's *Test*: ``(True, what answered)`` or ``(False, what failed and what to fix)``."""
        try:
            return self._check()
        except Exception as exc:  # a configuration error is an answer too: the UI shows the message
            return False, f"{self.hook_name}: {exc}"

    def _check(self) -> tuple[bool, str]:
        raise NotImplementedError


SQLITE = "sqlite:///"
#: Where a PostgreSQL tracking URI's login goes (a URI with credentials is refused: it is logged).
LIBPQ_VARS = ("PGUSER", "PGPASSWORD")
#: Tables every MLflow sqlite store has (the registry's, and the schema version MLflow migrates by).
MLFLOW_TABLES = frozenset({"registered_models", "alembic_version"})


def check_sqlite_store(uri: str) -> tuple[bool, str]:
    """*Test* of a ``sqlite:///`` tracking URI: the store opened read-only, as this process sees the path.

    An MLflow store answers with its registered-model count; a missing one is OK when a release could
    create it (its nearest existing directory is writable) and is reported as not there yet; a directory,
    a file that is no sqlite database or a database without MLflow's tables fail. Nothing is written."""
    path = Path(uri[len(SQLITE) :]).expanduser()
    if path.is_dir():
        return False, f"MLflow: {path} is a directory, not a sqlite file; use sqlite:///{path / 'mlflow.db'}"
    if not path.exists():
        parent = next((p for p in path.parents if p.exists()), None)
        if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            return False, f"MLflow: no store at {path}, and {parent} is not a writable directory here to create it in"
        return True, (
            f"MLflow OK — no MLflow store at {path} yet (as this process sees it): the first release creates it "
            f"({parent} is writable); check the path if you expected a store there"
        )
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if missing := MLFLOW_TABLES - tables:
                return False, f"MLflow: {path} is not an MLflow store (no {', '.join(sorted(missing))} table)"
            models = db.execute("SELECT count(*) FROM registered_models").fetchone()[0]
    except sqlite3.OperationalError as exc:
        return False, f"MLflow: {path} could not be read here ({exc}); check its permissions"
    except sqlite3.DatabaseError as exc:
        return False, f"MLflow: {path} is not a sqlite database ({exc}); check the tracking URI"
    what = f"{models} registered model(s)" if models else "no registered model yet"
    return True, f"MLflow OK — the model registry at {uri} answered (sqlite store opened read-only: {what})"


def mask_connection(conn) -> None:
    """Register ``conn``'s password and the values of its sensitive extras (Airflow's list of names:
    token, password, secret, ...) with the secrets masker of this process and the task supervisor."""
    if conn.password:
        mask_secret(conn.password)
    if conn.extra_dejson:
        mask_secret(dict(conn.extra_dejson))  # a mapping: each value masked when its key is a sensitive name


class TritonHook(_SeqclsHook):
    """Triton endpoints (one per replica) and the live model repository from a Connection."""

    conn_name_attr = "triton_conn_id"
    default_conn_name = "triton_default"
    conn_type = TRITON_CONN_TYPE
    hook_name = TRITON_NAME
    fallback = "SEQCLS_TRITON_GRPC / SEQCLS_TRITON_HTTP / SEQCLS_TRITON_REPOSITORY or the local defaults"
    DEFAULT_GRPC_PORT = 8001

    def __init__(
        self,
        triton_conn_id: str | None = None,
        *,
        grpc: list[str] | None = None,
        http: list[str] | None = None,
        repository: str | Path | None = None,
    ) -> None:
        super().__init__(triton_conn_id)
        self._grpc, self._http, self._repository = grpc, http, repository

    @cached_property
    def configured_endpoints(self) -> list[Endpoint]:
        """Endpoints as the arguments / the Connection name them (``dns:///`` unresolved, no key); empty →
        the caller uses its settings."""
        grpc = _split(self._grpc) or _split(self.extra.get("grpc_endpoints"))
        if not grpc and self.connection is not None and self.connection.host:
            grpc = [f"{self.connection.host}:{self.connection.port or self.DEFAULT_GRPC_PORT}"]
        http = _split(self._http) or _split(self.extra.get("http_endpoints"))
        if http and len(http) != len(grpc):
            raise InputError(
                f"connection {self.conn_id!r}: {len(grpc)} gRPC endpoint(s) {grpc} but {len(http)} HTTP "
                f"endpoint(s) {http}; list one of each per Triton replica, in the same order."
            )
        endpoints = [Endpoint(g, http[i] if http else None) for i, g in enumerate(grpc)]
        if endpoints:
            self.log.info(
                "Triton from connection %r: %s",
                self.conn_id,
                ", ".join(f"gRPC {e.grpc}" + (f" / HTTP {e.http}" if e.http else "") for e in endpoints),
            )
        return endpoints

    @cached_property
    def repository(self) -> Path | str | None:
        """The live repository: a path, or an ``s3://`` URI kept as written (a ``Path`` would fold its ``//``
        into a relative directory named ``s3:``)."""
        value = str(self._repository or self.extra.get("repository") or "").strip()
        if not value:
            return None
        return value if value.startswith("s3://") else Path(value)

    @cached_property
    def store_conn_id(self) -> str:
        """The Connection of an ``s3://`` repository's store (extra ``store_conn_id``; ``aws_default``)."""
        return str(self.extra.get("store_conn_id") or "").strip() or DEFAULT_STORE_CONN

    def store_env(self, repository: object) -> dict[str, str | None]:
        """For an ``s3://`` ``repository`` (the settings', Connection or environment): the AWS variables
        from :attr:`store_conn_id` (for ``scoped_environ``); ``{}`` for a directory or no such Connection."""
        if not str(repository or "").startswith("s3://"):
            return {}
        return StoreConnection(self.store_conn_id).environment()

    @cached_property
    def control_key(self) -> str | None:
        """The Connection's password: Triton's model-control key (None → SEQCLS_TRITON_CONTROL_KEY / the
        local server's key file)."""
        conn = self.connection
        return (conn.password if conn is not None else None) or None

    def settings_overrides(self) -> dict[str, Any]:
        """Keyword overrides for :meth:`Settings.from_env` (None = keep the settings' value)."""
        eps = self.configured_endpoints
        return {
            "triton_grpc": tuple(e.grpc for e in eps) or None,
            "triton_http": tuple(e.http for e in eps if e.http) or None,
            "triton_repository": self.repository,
            "triton_control_key": self.control_key,
        }

    def endpoints(self) -> list[Endpoint]:
        """One endpoint per Triton replica (``dns:///`` names resolved now), with the control key; the
        settings' defaults when the Connection names none."""
        return endpoints_from_settings(Settings.from_env(**self.settings_overrides()))

    def get_conn(self) -> list[TritonOps]:
        """The real client: one :class:`~seqcls.serving.client.TritonOps` per replica (its ``.client`` is
        tritonclient's gRPC ``InferenceServerClient``, sending the key on model-control calls only)."""
        return [TritonOps(e) for e in self.endpoints()]

    def _check(self) -> tuple[bool, str]:
        endpoints = self.endpoints()
        if self.control_key:
            source = "the Connection's password"
        elif any(e.control_key for e in endpoints):
            source = "SEQCLS_TRITON_CONTROL_KEY / the repository's key file"
        else:
            source = "nowhere (none set)"
        return check_triton(endpoints, self.repository, source)


#: The Connection an ``s3://`` repository's store credentials come from unless the Triton one names another.
DEFAULT_STORE_CONN = "aws_default"


class StoreConnection(_SeqclsHook):
    """An object store's endpoint, region and credentials from an AWS-type Connection (Amazon's field
    names, so an ``aws_default`` made for the Amazon provider works as it is). Not a connection type of
    ours: the Amazon provider's form (or ``generic``) defines it."""

    conn_name_attr = "store_conn_id"
    default_conn_name = DEFAULT_STORE_CONN
    hook_name = "object store (seqcls)"
    fallback = "the workers' AWS_* variables"

    def environment(self) -> dict[str, str | None]:
        """The AWS variables for ``scoped_environ`` (masked): the key id, secret and session token together
        (a worker's own token never mixes with a Connection's key), the endpoint and region when set."""
        conn = self.connection
        if conn is None:
            return {}
        extra = self.extra
        key_id = conn.login or extra.get("aws_access_key_id")
        secret = conn.password or extra.get("aws_secret_access_key")
        token = extra.get("aws_session_token")
        env: dict[str, str | None] = {}
        if key_id and secret:
            for value in (secret, token):
                if value:
                    mask_secret(str(value))
            env.update(zip(AWS_CREDENTIAL_VARS, (str(key_id), str(secret), str(token) if token else None), strict=True))
        elif key_id or secret:
            raise InputError(
                f"connection {self.conn_id!r}: an access key id needs its secret access key (login and password)"
            )
        if endpoint := extra.get("endpoint_url"):
            env[AWS_ENDPOINT_VARS[0]] = str(endpoint)
        if region := extra.get("region_name"):
            env[AWS_REGION_VARS[0]] = str(region)
        return env

    def _check(self) -> tuple[bool, str]:
        return True, f"{self.conn_id}: {', '.join(sorted(self.environment())) or 'nothing set'}"


class MlflowHook(_SeqclsHook):
    """The MLflow tracking/registry URI from a Connection, and one cached ``MlflowClient``."""

    conn_name_attr = "mlflow_conn_id"
    default_conn_name = "mlflow_default"
    conn_type = MLFLOW_CONN_TYPE
    hook_name = MLFLOW_NAME
    fallback = "SEQCLS_MLFLOW_TRACKING_URI / MLFLOW_TRACKING_URI or the sqlite store under SEQCLS_HOME"

    def __init__(self, mlflow_conn_id: str | None = None, *, tracking_uri: str | None = None) -> None:
        super().__init__(mlflow_conn_id)
        self._tracking_uri = tracking_uri

    @cached_property
    def tracking_uri(self) -> str | None:
        """URI from arguments / the Connection (never with credentials); None → the settings' default."""
        uri = self._tracking_uri or self.extra.get("tracking_uri")
        conn = self.connection
        if not uri and conn is not None and conn.host:
            scheme = conn.schema or "http"
            uri = f"{scheme}://{conn.host}" + (f":{conn.port}" if conn.port else "")
        if uri:
            fix = f"put them in connection {self.conn_id!r}'s login and password (or a token) instead"
            check_tracking_uri(str(uri), fix)
            self.log.info("MLflow from connection %r: %s", self.conn_id, uri)
        return uri or None

    def credentials_env(self) -> dict[str, str | None]:
        """MLflow's credential variables from the Connection (for ``scoped_environ``; masked): login +
        password, or a token (extra ``token``, or a password without login); ``{}`` without any. For a
        PostgreSQL store opened directly (``postgresql://host/db``): libpq's ``PGUSER`` / ``PGPASSWORD``."""
        conn = self.connection
        if conn is None:
            return {}
        token = self.extra.get("token") or (conn.password if not conn.login else None)
        password = conn.password if conn.login else None
        for secret in (password, token):
            if secret:
                mask_secret(secret)
        if self.tracking_uri and self.tracking_uri.split(":", 1)[0].split("+", 1)[0].lower() == "postgresql":
            # a PostgreSQL store opened directly: psycopg2 reads libpq's variables, never MLflow's HTTP ones
            return dict(zip(LIBPQ_VARS, (conn.login, password), strict=True)) if password else {}
        return mlflow_credentials(conn.login, password, str(token) if token else None)

    def get_conn(self):
        """The real client: an ``MlflowClient`` for the Connection's tracking URI."""
        return self.client

    def _check(self) -> tuple[bool, str]:
        settings = Settings.from_env(mlflow_tracking_uri=self.tracking_uri)
        if str(settings.mlflow_tracking_uri).startswith(SQLITE):
            return check_sqlite_store(str(settings.mlflow_tracking_uri))
        return check_mlflow(settings, self.credentials_env())

    @cached_property
    def client(self):
        """An ``MlflowClient``; use it inside ``scoped_environ(hook.credentials_env())`` when MLflow needs them."""
        return mlflow_client(Settings.from_env(mlflow_tracking_uri=self.tracking_uri))


__all__ = ["MlflowHook", "StoreConnection", "TritonHook", "check_sqlite_store", "mask_connection"]
