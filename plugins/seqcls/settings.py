"""One place for defaults, environment variables and where things live.

Resolution order everywhere: explicit argument (CLI flag / DAG param) > Airflow Connection
(resolved in ``seqcls.airflow``, passed in as an argument) > environment variable > embedded
default. The embedded defaults run everything on one machine: releases, the MLflow sqlite store
and the live Triton repository all under ``SEQCLS_HOME`` (default ``~/.seqcls``), Triton on
loopback.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from seqcls.errors import InputError

#: Environment variables seqcls reads (each has a row in seqcls.environment.ENVIRONMENT, which
#: docs/configuration.md is generated from).
ENV_HOME = "SEQCLS_HOME"
# the live Triton repository: a directory every replica mounts, or s3://bucket/prefix on an S3-API store (endpoint,
# region and credentials from AWS_ENDPOINT_URL_S3, AWS_REGION, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)
ENV_TRITON_REPOSITORY = "SEQCLS_TRITON_REPOSITORY"
ENV_TRITON_GRPC = "SEQCLS_TRITON_GRPC"  # comma-separated host:port, one per replica
ENV_TRITON_HTTP = "SEQCLS_TRITON_HTTP"  # comma-separated host:port, same order as gRPC
ENV_TRITON_METRICS = "SEQCLS_TRITON_METRICS"  # comma-separated host:port of the metrics port, same order
# name=addr,addr;name2=addr: static answers for dns:/// endpoints (like curl --resolve)
ENV_TRITON_RESOLVE = "SEQCLS_TRITON_RESOLVE"
# the key Triton's model control (load/unload/repository index) requires; unset = a local Triton's key file
ENV_TRITON_CONTROL_KEY = "SEQCLS_TRITON_CONTROL_KEY"
ENV_MLFLOW_URI = "SEQCLS_MLFLOW_TRACKING_URI"
ENV_RUNTIME = "SEQCLS_RUNTIME"
ENV_DEVICE = "SEQCLS_DEVICE"  # cpu | gpu: what serving configs are rendered for
ENV_PADDLE_PYTHON = "SEQCLS_PADDLE_PYTHON"  # external interpreter for heavy Paddle steps
ENV_MODEL_REPOSITORY_SOURCE = "SEQCLS_MODEL_REPOSITORY_SOURCE"
ENV_CHECKPOINTS_ROOT = "SEQCLS_CHECKPOINTS_ROOT"
ENV_FAULT_PLAN = "SEQCLS_FAULT_PLAN"  # test-only: see seqcls.faults
ENV_MODEL_NAME = "SEQCLS_MODEL_NAME"  # the DAG's model (parse time)
ENV_SCHEDULE = "SEQCLS_SCHEDULE"  # the DAG's schedule: unset/manual, a cron preset/expression, or "asset"
ENV_SERVING_LAYOUT = "SEQCLS_SERVING_LAYOUT"  # INSTANCESxTHREADS of the ONNX model, e.g. 2x1 (default 1x2)
ENV_SERVING_METRICS = "SEQCLS_SERVING_METRICS"  # on (default) | off: the python models' seqcls_* metrics
ENV_SERVING_PIPELINE = "SEQCLS_SERVING_PIPELINE"  # ensemble (default) | direct: how <m> runs the three steps
ENV_MODELS_FILE = "SEQCLS_MODELS_FILE"  # the release DAGs' models file (parse time): a path, or "none"
ENV_EVAL_SET_MAX_MB = "SEQCLS_EVAL_SET_MAX_MB"  # the largest eval set a release reads (MB, default 50)
ENV_EVAL_SET_MAX_TEXTS = "SEQCLS_EVAL_SET_MAX_TEXTS"  # the most labeled texts a release scores (default 200000)
DEFAULT_EVAL_SET_MAX_MB = 50
DEFAULT_EVAL_SET_MAX_TEXTS = 200_000
ENV_GC_KEEP_REFUSED = "SEQCLS_GC_KEEP_REFUSED"  # `seqcls gc`: refused attempts whose evidence (failed/) is kept
ENV_GC_MIN_AGE = "SEQCLS_GC_MIN_AGE"  # `seqcls gc`: seconds a workspace is left alone after its last write
ENV_GC_MLFLOW_VERSIONS = "SEQCLS_GC_MLFLOW_VERSIONS"  # `seqcls gc`: archive (default) | delete | keep old versions
DEFAULT_GC_KEEP_REFUSED = 5
ENV_GC_EVIDENCE_KEEP = "SEQCLS_GC_EVIDENCE_KEEP"  # `seqcls gc`: the newest releases whose evidence stays as is
DEFAULT_GC_EVIDENCE_KEEP = 30
ENV_STATELOG_ROTATE_BYTES = "SEQCLS_STATELOG_ROTATE_BYTES"  # `seqcls gc`: a state log larger than this is rotated
DEFAULT_STATELOG_ROTATE_BYTES = 256_000
DEFAULT_GC_MIN_AGE = 3600.0
DEFAULT_GC_MLFLOW_VERSIONS = "archive"
GC_MLFLOW_POLICIES = ("archive", "delete", "keep")
#: Set (not read) around paddle2onnx: ``"0"`` forbids polygraphy from pip-installing at conversion.
ENV_POLYGRAPHY_AUTOINSTALL = "POLYGRAPHY_AUTOINSTALL_DEPS"

DEFAULT_MODEL_NAME = "seqcls"
DEFAULT_GRPC = "127.0.0.1:8001"
DEFAULT_HTTP = "127.0.0.1:8000"
DEFAULT_METRICS = "127.0.0.1:8002"
#: The request header Triton checks on restricted APIs (HTTP); gRPC metadata is ``triton-grpc-protocol-<it>``.
CONTROL_HEADER = "triton-control-key"
#: Where a local Triton keeps the control key it generated: its model repository's root, mode 0600.
CONTROL_KEY_FILE = ".seqcls-triton-control-key"
#: hex, base64 and base64url keys; at least 16 characters (``openssl rand -hex 32`` is 64).
_CONTROL_KEY_RE = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")
RUNTIMES = ("python-onnxruntime", "onnxruntime")
DEVICES = ("cpu", "gpu")
#: How the public model ``<m>`` runs tokenizer → model → postprocess: Triton's ensemble of the three
#: models, or ``direct`` — one python model running the same three steps in one stub (python runtime only).
PIPELINES = ("ensemble", "direct")


#: Project root when running from a checkout / editable install (model_repository/ lives there).
PROJECT_ROOT = Path(__file__).resolve().parents[2]
#: The Triton model-repository template publish copies from (SEQCLS_MODEL_REPOSITORY_SOURCE overrides it).
DEFAULT_MODEL_REPOSITORY_SOURCE = PROJECT_ROOT / "model_repository"


def _split_endpoints(value: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in value.split(",") if p.strip())


#: The variables Airflow sets for a running task, as ``seqcls history`` records them (who changed what).
AIRFLOW_TASK_CONTEXT = (
    ("dag_id", "AIRFLOW_CTX_DAG_ID"),
    ("run_id", "AIRFLOW_CTX_DAG_RUN_ID"),
    ("try", "AIRFLOW_CTX_TRY_NUMBER"),
    ("run_url", "SEQCLS_AIRFLOW_RUN_URL"),  # set by seqcls.airflow.tasks: the run's page, tagged on MLflow
)
#: The Airflow UI page of the DAG run a task belongs to (the MLflow version it released links back to it).
ENV_AIRFLOW_RUN_URL = "SEQCLS_AIRFLOW_RUN_URL"


def airflow_task_context() -> dict[str, str]:
    """The Airflow dag/run/try this process runs as a task of ({} outside Airflow)."""
    return {key: os.environ[env] for key, env in AIRFLOW_TASK_CONTEXT if os.environ.get(env)}


def default_home() -> Path:
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".seqcls").expanduser()


@contextlib.contextmanager
def scoped_env(name: str, value: str) -> Iterator[None]:
    """Set the environment variable ``name`` to ``value`` for the ``with`` block, then restore it.

    Why it exists: paddle2onnx runs polygraphy's optimiser, and polygraphy pip-installs missing
    dependencies at conversion time unless ``POLYGRAPHY_AUTOINSTALL_DEPS=0``; ``convert`` sets it
    only around the call, so a release never changes the interpreter and the caller's environment
    is left as it was (unset stays unset).
    """
    with scoped_environ({name: value}):
        yield


@contextlib.contextmanager
def scoped_environ(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set (a string) or unset (None) each variable of ``values`` for the ``with`` block, then restore each.

    Also why credentials reach MLflow this way (:func:`mlflow_credentials`): MLflow reads its own
    variables on every request, and one process may talk to several servers in turn (``seqcls_sync``,
    ``dag.test()``), so a Connection's credentials hold only while its work runs.
    """
    old = {name: os.environ.get(name) for name in values}
    try:
        _put_environ(values)
        yield
    finally:
        _put_environ(old)


def _put_environ(values: Mapping[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


#: MLflow's own credential variables (basic auth, or a bearer token), set only by :func:`scoped_environ`.
MLFLOW_CREDENTIAL_VARS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")


def mlflow_credentials(username: str | None, password: str | None, token: str | None) -> dict[str, str | None]:
    """:data:`MLFLOW_CREDENTIAL_VARS` for :func:`scoped_environ`: all three together (a worker's own token
    never mixes with a Connection's login); ``{}`` without a password or token (the environment's own hold)."""
    if not (password or token):
        return {}
    return dict(zip(MLFLOW_CREDENTIAL_VARS, (username if password else None, password, token), strict=True))


def check_tracking_uri(uri: str, fix: str) -> str:
    """``uri`` unless it embeds credentials (``user:password@host``): it is logged and recorded (release
    manifest, extra links), so those are refused, saying ``fix`` — without echoing them."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    if "@" in parts.netloc:
        shown = f"{parts.scheme}://***@{parts.netloc.rpartition('@')[2]}{parts.path}"
        raise InputError(f"MLflow tracking URI {shown} embeds credentials (user:password@): {fix}")
    return uri


ENV_PROMETHEUS_URL = "SEQCLS_PROMETHEUS_URL"  # `seqcls monitor --since`: ask this Prometheus instead of snapshots


def _number(env: Mapping[str, str], name: str, kind: type, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise InputError(f"{name}={text!r}: expected a {kind.__name__}, e.g. {default}") from None


def _on_off(name: str, text: str) -> bool:
    value = text.strip().lower() or "on"
    if value not in ("on", "off"):
        raise InputError(f"{name}={text!r}: expected on or off")
    return value == "on"


def prometheus_url() -> str | None:
    """The Prometheus that scrapes every Triton replica (``SEQCLS_PROMETHEUS_URL``), or None: ``seqcls
    monitor`` then windows by its own snapshots of the counters."""
    return os.environ.get(ENV_PROMETHEUS_URL, "").strip() or None


ENV_NOTIFY_URLS = "SEQCLS_NOTIFY_URLS"  # Apprise URLs (space-separated): `seqcls release`/`rollback` outcomes


def notify_urls() -> tuple[str, ...]:
    """The Apprise URLs ``seqcls release`` and ``seqcls rollback`` send their outcome to (``SEQCLS_NOTIFY_URLS``,
    separated by spaces; also the single release DAG's when there is no models file), read at call time.

    Unset or empty: nothing is sent. Checked by :func:`seqcls.notify.check_urls` where they are used: a
    notification never fails or changes a release, so a bad URL is a warning there, not an error here.
    """
    return tuple(os.environ.get(ENV_NOTIFY_URLS, "").split())


def fault_plan() -> str:
    """The test-only fault plan (``SEQCLS_FAULT_PLAN``, or the file it names as ``@path``); empty in production.
    See :mod:`seqcls.faults`."""
    plan = os.environ.get(ENV_FAULT_PLAN, "")
    if not plan.startswith("@"):
        return plan
    try:
        return ",".join(Path(plan[1:]).read_text(encoding="utf-8").split())
    except FileNotFoundError:
        return ""


def check_control_key(key: str, source: str = ENV_TRITON_CONTROL_KEY) -> str:
    """``key`` if it can travel as a header value and on Triton's command line; else InputError naming ``source``."""
    if not isinstance(key, str) or not _CONTROL_KEY_RE.fullmatch(key):
        raise InputError(
            f"{source}: the Triton control key must be 16-512 characters from letters, digits and '._~+/=-' "
            "(e.g. `openssl rand -hex 32`)"  # never echo the value: it is a secret
        )
    return key


def read_control_key(repository: Path) -> str | None:
    """The key a local Triton generated for ``repository`` (:data:`CONTROL_KEY_FILE`), or None."""
    path = Path(repository) / CONTROL_KEY_FILE
    try:
        return path.read_text(encoding="ascii").strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the Triton control key {path} ({exc}); set {ENV_TRITON_CONTROL_KEY}") from exc


def control_headers(key: str | None, protocol: str = "grpc") -> dict[str, str] | None:
    """The headers carrying ``key`` on a restricted call (``protocol`` ``grpc`` or ``http``); None without a key."""
    if not key:
        return None
    name = f"triton-grpc-protocol-{CONTROL_HEADER}" if protocol == "grpc" else CONTROL_HEADER
    return {name: key}


def parse_layout(text: str, *, source: str = ENV_SERVING_LAYOUT) -> tuple[int, int]:
    """``"2x1"`` → ``(model instances, ORT intra-op threads per instance)``; anything else names ``source``.

    Which layout is fastest depends on the host (cores, what else runs there): ``seqcls calibrate-layout``
    measures them on the target Triton; the release's ``layout`` (default: this setting) applies the answer.
    """
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise InputError(f"{source}={text!r}: expected INSTANCESxTHREADS, e.g. 2x1 or 1x2")
    instances, threads = (int(p) for p in parts)
    if not (1 <= instances <= 64 and 1 <= threads <= 256):
        raise InputError(f"{source}={text!r}: instances in 1..64 and threads in 1..256")
    return instances, threads


def model_repository_source_from_env() -> Path:
    """Only the serving source directory (what importing the shipped modules checks): a mistake in another
    setting is reported by the command that reads it, not as an import error of every module."""
    value = os.environ.get(ENV_MODEL_REPOSITORY_SOURCE)
    return Path(value) if value else DEFAULT_MODEL_REPOSITORY_SOURCE


#: ``s3://``, ``gs://``, ``as://``, ``https://``…: a URI, which ``Path`` would silently turn into ``./s3:/…``.
_OBJECT_STORE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/")


#: Where the working copies of object-store repositories live under ``SEQCLS_HOME``; the rest of the path is the
#: store's bucket and prefix, so the directory itself says which store it stands for (no file to keep in step).
STORES_DIR = ("triton", "stores", "s3")


def store_working_copy(home: Path, uri: str) -> Path:
    """This host's working copy of the ``s3://`` repository ``uri``: ``<home>/triton/stores/s3/<bucket>/<prefix>``.

    Why a directory at all: publish assembles and hashes a version on a filesystem before uploading it,
    and the readers of a version (status, sync, the quality gate's champion) read its files from there.
    """
    parts = [p for p in uri[len("s3://") :].split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise InputError(f"{ENV_TRITON_REPOSITORY}={uri!r}: write s3://bucket/prefix (no '.' or '..' segments)")
    return Path(home).expanduser().resolve().joinpath(*STORES_DIR, *parts)


@dataclass(frozen=True)
class Settings:
    """Resolved locations and endpoints; build with :meth:`from_env` and override fields."""

    home: Path = field(default_factory=default_home)
    triton_repository: Path | None = None
    #: The ``s3://bucket/prefix`` repository when SEQCLS_TRITON_REPOSITORY names one; ``triton_repository`` is then
    #: this host's working copy of it (see :func:`store_working_copy`), and the store is the truth.
    triton_store: str | None = None
    triton_grpc: tuple[str, ...] = ()
    triton_http: tuple[str, ...] = ()
    triton_metrics: tuple[str, ...] = ()
    mlflow_tracking_uri: str | None = None
    runtime: str = "python-onnxruntime"
    device: str = "cpu"
    paddle_python: str | None = None
    model_repository_source: Path | None = None
    checkpoints_root: Path | None = None
    #: Triton's model-control key (SEQCLS_TRITON_CONTROL_KEY / the Triton Connection's password); see control_key().
    triton_control_key: str | None = field(default=None, repr=False)
    #: The ONNX model's instances x ORT intra-op threads (SEQCLS_SERVING_LAYOUT, e.g. "2x1"); None: 1x2.
    serving_layout: str | None = None
    #: Whether the serving models export seqcls_* metrics (SEQCLS_SERVING_METRICS=off: to measure their cost).
    serving_metrics: bool = True
    #: How ``<m>`` runs the three steps (SEQCLS_SERVING_PIPELINE): "ensemble" or "direct" (see PIPELINES).
    serving_pipeline: str = "ensemble"
    #: The largest eval set a release reads and the most texts it scores (SEQCLS_EVAL_SET_MAX_MB / _TEXTS).
    eval_set_max_mb: float = DEFAULT_EVAL_SET_MAX_MB
    eval_set_max_texts: int = DEFAULT_EVAL_SET_MAX_TEXTS
    #: Retention (``seqcls gc``): the newest refused attempts per model whose evidence is kept
    #: (SEQCLS_GC_KEEP_REFUSED), and how long a workspace is left alone after its last write (SEQCLS_GC_MIN_AGE,
    #: seconds: a release may be between two steps of it).
    gc_keep_refused: int = DEFAULT_GC_KEEP_REFUSED
    gc_min_age: float = DEFAULT_GC_MIN_AGE
    #: What gc does with an MLflow version no serving, rollback or restore reaches (SEQCLS_GC_MLFLOW_VERSIONS):
    #: "archive" (its heavy artifacts go, the version stays), "delete" or "keep".
    gc_mlflow_versions: str = DEFAULT_GC_MLFLOW_VERSIONS
    #: The newest releases per model whose evidence stays as it is (SEQCLS_GC_EVIDENCE_KEEP); older ones nothing
    #: else keeps are compacted into one audit record each.
    gc_evidence_keep: int = DEFAULT_GC_EVIDENCE_KEEP
    #: A state log larger than this many bytes is rotated by gc into a compressed segment and a snapshot
    #: (SEQCLS_STATELOG_ROTATE_BYTES): what the common readers of the log read at most.
    statelog_rotate_bytes: int = DEFAULT_STATELOG_ROTATE_BYTES

    def __post_init__(self) -> None:
        object.__setattr__(self, "home", Path(self.home).expanduser().resolve())
        if self.runtime not in RUNTIMES:
            raise InputError(f"runtime {self.runtime!r} is not one of {', '.join(RUNTIMES)}")
        if self.device not in DEVICES:
            raise InputError(f"device {self.device!r} is not one of {', '.join(DEVICES)}")
        if self.triton_repository is None:
            object.__setattr__(self, "triton_repository", self.home / "triton" / "model_repository")
        if str(self.triton_repository).startswith("s3://"):
            object.__setattr__(self, "triton_store", str(self.triton_repository))
            object.__setattr__(self, "triton_repository", store_working_copy(self.home, str(self.triton_repository)))
        elif scheme := _OBJECT_STORE.match(str(self.triton_repository)):
            raise InputError(
                f"{ENV_TRITON_REPOSITORY} (or the Triton Connection's extra repository) is {self.triton_repository!r}, "
                f"an object store seqcls has no backend for ({scheme.group(1).lower()}://): use an S3-API store "
                "(s3://bucket/prefix, with AWS_ENDPOINT_URL_S3 for MinIO/SeaweedFS) or a POSIX directory that every "
                "Triton replica mounts (the compose file's /models, the Kubernetes RWX claim's mount)."
            )
        object.__setattr__(self, "triton_repository", Path(self.triton_repository))
        if not self.triton_grpc:
            object.__setattr__(self, "triton_grpc", (DEFAULT_GRPC,))
            if not self.triton_metrics:  # the local default server: its metrics port too
                object.__setattr__(self, "triton_metrics", (DEFAULT_METRICS,))
        if not self.triton_http:
            object.__setattr__(self, "triton_http", (DEFAULT_HTTP,))
        if self.mlflow_tracking_uri is None:
            db = self.home / "mlflow" / "mlflow.db"
            object.__setattr__(self, "mlflow_tracking_uri", f"sqlite:///{db}")
        if self.model_repository_source is None:
            object.__setattr__(self, "model_repository_source", DEFAULT_MODEL_REPOSITORY_SOURCE)
        if self.checkpoints_root is None:
            object.__setattr__(self, "checkpoints_root", self.home / "checkpoints")
        if self.serving_pipeline not in PIPELINES:
            raise InputError(
                f"{ENV_SERVING_PIPELINE}={self.serving_pipeline!r}: expected one of {', '.join(PIPELINES)}"
            )
        if self.serving_layout is not None:
            object.__setattr__(self, "serving_layout", str(self.serving_layout).strip() or None)
            if self.serving_layout is not None:
                parse_layout(self.serving_layout)
        if not (self.eval_set_max_mb > 0 and self.eval_set_max_texts > 0):
            raise InputError(f"{ENV_EVAL_SET_MAX_MB} and {ENV_EVAL_SET_MAX_TEXTS} must be positive")
        keep = self.gc_keep_refused
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise InputError(f"{ENV_GC_KEEP_REFUSED} / keep_refused must be an integer ≥ 0, got {keep!r}")
        evidence = self.gc_evidence_keep
        if isinstance(evidence, bool) or not isinstance(evidence, int) or evidence < 0:
            raise InputError(f"{ENV_GC_EVIDENCE_KEEP} / evidence_keep must be an integer ≥ 0, got {evidence!r}")
        rotate = self.statelog_rotate_bytes
        if isinstance(rotate, bool) or not isinstance(rotate, int) or rotate < 1:
            what = f"{ENV_STATELOG_ROTATE_BYTES} / statelog_rotate_bytes"
            raise InputError(f"{what} must be a whole number of bytes ≥ 1, got {rotate!r}")
        if not self.gc_min_age >= 0:
            raise InputError(f"{ENV_GC_MIN_AGE} must be seconds ≥ 0, got {self.gc_min_age!r}")
        policy = str(self.gc_mlflow_versions).strip().lower()
        if policy not in GC_MLFLOW_POLICIES:
            raise InputError(
                f"{ENV_GC_MLFLOW_VERSIONS} / mlflow_versions must be one of {', '.join(GC_MLFLOW_POLICIES)}, "
                f"got {self.gc_mlflow_versions!r}"
            )
        object.__setattr__(self, "gc_mlflow_versions", policy)
        if self.triton_control_key is not None:
            key = str(self.triton_control_key).strip()
            source = f"{ENV_TRITON_CONTROL_KEY} / the Triton Connection's password"
            object.__setattr__(self, "triton_control_key", check_control_key(key, source) if key else None)

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Settings from the environment; keyword overrides that are not None win."""
        env = os.environ
        values: dict[str, object] = {
            "home": default_home(),
            "triton_repository": env.get(ENV_TRITON_REPOSITORY) or None,  # checked (not a URI), then a Path
            "triton_grpc": _split_endpoints(env.get(ENV_TRITON_GRPC, "")),
            "triton_http": _split_endpoints(env.get(ENV_TRITON_HTTP, "")),
            "triton_metrics": _split_endpoints(env.get(ENV_TRITON_METRICS, "")),
            "mlflow_tracking_uri": env.get(ENV_MLFLOW_URI) or env.get("MLFLOW_TRACKING_URI") or None,
            "runtime": default_runtime(),
            "device": env.get(ENV_DEVICE) or "cpu",
            "paddle_python": env.get(ENV_PADDLE_PYTHON) or None,
            "model_repository_source": (
                Path(env[ENV_MODEL_REPOSITORY_SOURCE]) if env.get(ENV_MODEL_REPOSITORY_SOURCE) else None
            ),
            "checkpoints_root": Path(env[ENV_CHECKPOINTS_ROOT]) if env.get(ENV_CHECKPOINTS_ROOT) else None,
            "triton_control_key": env.get(ENV_TRITON_CONTROL_KEY) or None,
            "serving_layout": env.get(ENV_SERVING_LAYOUT) or None,
            "serving_metrics": _on_off(ENV_SERVING_METRICS, env.get(ENV_SERVING_METRICS, "on")),
            "serving_pipeline": (env.get(ENV_SERVING_PIPELINE) or "ensemble").strip().lower(),
            "eval_set_max_mb": _number(env, ENV_EVAL_SET_MAX_MB, float, DEFAULT_EVAL_SET_MAX_MB),
            "eval_set_max_texts": _number(env, ENV_EVAL_SET_MAX_TEXTS, int, DEFAULT_EVAL_SET_MAX_TEXTS),
            "gc_keep_refused": _number(env, ENV_GC_KEEP_REFUSED, int, DEFAULT_GC_KEEP_REFUSED),
            "gc_min_age": _number(env, ENV_GC_MIN_AGE, float, DEFAULT_GC_MIN_AGE),
            "gc_mlflow_versions": env.get(ENV_GC_MLFLOW_VERSIONS) or DEFAULT_GC_MLFLOW_VERSIONS,
            "gc_evidence_keep": _number(env, ENV_GC_EVIDENCE_KEEP, int, DEFAULT_GC_EVIDENCE_KEEP),
            "statelog_rotate_bytes": _number(env, ENV_STATELOG_ROTATE_BYTES, int, DEFAULT_STATELOG_ROTATE_BYTES),
        }
        for key, value in overrides.items():
            if key not in values:
                raise TypeError(f"unknown setting {key!r}")
            if value is not None:
                values[key] = value
        if isinstance(values["triton_grpc"], str):
            values["triton_grpc"] = _split_endpoints(values["triton_grpc"])  # type: ignore[arg-type]
        for key in ("triton_http", "triton_metrics"):
            if isinstance(values[key], str):
                values[key] = _split_endpoints(values[key])  # type: ignore[arg-type]
        return cls(**values)  # type: ignore[arg-type]

    @property
    def releases_dir(self) -> Path:
        return self.home / "releases"

    @property
    def eval_sets_dir(self) -> Path:
        """The eval sets releases were judged on, kept once per home by content (``<sha256><suffix>``)."""
        return self.home / "evalsets"

    @property
    def mlflow_artifacts_dir(self) -> Path:
        return self.home / "mlflow" / "artifacts"

    @property
    def triton_dir(self) -> Path:
        """Local Triton state: server copy, pid file, logs."""
        return self.home / "triton"

    def control_key(self) -> str | None:
        """The key sent on model-control calls, read now: the explicit one (environment, Airflow Connection)
        wins; else the key a local Triton generated in the repository (:data:`CONTROL_KEY_FILE`); else None.

        Why the repository: it is what every endpoint serving it and every process releasing into it share
        (like the recorded serving state), so the CLI, Airflow tasks and all local replicas find one key.
        """
        return self.triton_control_key or read_control_key(Path(str(self.triton_repository)))


def dag_model_name() -> str:
    """The model the DAG file releases (``SEQCLS_MODEL_NAME``; the models file checks it at parse time)."""
    return os.environ.get(ENV_MODEL_NAME) or DEFAULT_MODEL_NAME


def dag_schedule() -> str:
    """The raw ``SEQCLS_SCHEDULE`` value (the DAG interprets it: manual, cron, or ``asset``)."""
    return os.environ.get(ENV_SCHEDULE, "")


def dag_models_file() -> str:
    """The raw ``SEQCLS_MODELS_FILE`` value (``seqcls.airflow.models_file`` resolves it: unset = ``seqcls-models.yaml``
    beside the DAG file if it exists, ``none`` = no file: one DAG for ``SEQCLS_MODEL_NAME``)."""
    return os.environ.get(ENV_MODELS_FILE, "")


def default_runtime() -> str:
    return os.environ.get(ENV_RUNTIME) or RUNTIMES[0]


ENV_ALLOW_UNSAFE_PICKLE = "SEQCLS_ALLOW_UNSAFE_PICKLE"  # 1: load .pdparams pickles without the allowlist scan


def allow_unsafe_pickle() -> bool:
    """``SEQCLS_ALLOW_UNSAFE_PICKLE=1``: skip :func:`~seqcls.checkpoints.safeload.scan_pickle` (default off,
    never advised)."""
    return os.environ.get(ENV_ALLOW_UNSAFE_PICKLE, "").strip().lower() in ("1", "true", "yes", "on")


def triton_resolve() -> dict[str, tuple[str, ...]]:
    """Static name → addresses for ``dns:///`` Triton endpoints, read at call time.

    Why: a replica set is addressed by one DNS name (a Kubernetes headless Service); hosts without
    that DNS (a laptop port-forwarding, the test suite's three loopback Tritons) pin the answer here,
    as ``curl --resolve`` does. Unset: the system resolver answers.
    """
    out: dict[str, tuple[str, ...]] = {}
    for entry in (os.environ.get(ENV_TRITON_RESOLVE) or "").split(";"):
        if not entry.strip():
            continue
        name, sep, addrs = entry.partition("=")
        values = tuple(a.strip() for a in addrs.split(",") if a.strip())
        if not sep or not name.strip() or not values:
            raise InputError(f"{ENV_TRITON_RESOLVE}: {entry!r} is not name=addr[,addr...] (entries separated by ';')")
        out[name.strip()] = values
    return out


#: The standard AWS variables an ``s3://`` object store falls back to when neither an argument nor an
#: Airflow Connection says (botocore's own names, so a worker set up for the AWS CLI works unchanged).
AWS_ENDPOINT_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
AWS_REGION_VARS = ("AWS_REGION", "AWS_DEFAULT_REGION")
AWS_CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def aws_s3_environment() -> dict[str, str | None]:
    """The object store's endpoint, region and credentials from the standard AWS variables, read now.

    Why here: this module is the one place that reads the environment; seqcls.serving.objectstore
    takes these values as arguments, so explicit arguments (a Connection) always win and a test
    never has to touch the process environment. Keys: endpoint, region, access_key_id,
    secret_access_key, session_token (None when unset).
    """

    def first(names: tuple[str, ...]) -> str | None:
        return next((os.environ[n].strip() for n in names if os.environ.get(n, "").strip()), None)

    key_id, secret, token = ((os.environ.get(n) or "").strip() or None for n in AWS_CREDENTIAL_VARS)
    return {
        "endpoint": first(AWS_ENDPOINT_VARS),
        "region": first(AWS_REGION_VARS),
        "access_key_id": key_id,
        "secret_access_key": secret,
        "session_token": token,
    }
