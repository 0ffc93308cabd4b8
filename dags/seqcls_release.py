"""
# seqcls_release — a trained ERNIE classifier to Triton, recorded in MLflow

One DAG per model of the **models file** (`SEQCLS_MODELS_FILE`, else `seqcls-models.yaml` beside
this file; see `seqcls.airflow.models_file`): `seqcls_release` for the default model `seqcls`,
`seqcls_release__<model>` for the others, each with its own schedule, checkpoints root,
release-param defaults and Connections. Without a models file: the one DAG `seqcls_release` for
`SEQCLS_MODEL_NAME`, scheduled by `SEQCLS_SCHEDULE`, as before.

The release checklist, one task per step of the `seqcls` library (each task re-opens the
release workspace `$SEQCLS_HOME/releases/<model>/<fingerprint>/` from its params and calls one
step; every step is idempotent, so re-running a run or a task redoes only what is missing):

- `resolve_checkpoint` — validates the params and the checkpoint (cheap, before any heavy
  work), resolves `latest`; skips the whole run when the checkpoint already is the MLflow champion
- `export_static` — checkpoint → Paddle static graph
- `convert_onnx` — static graph → ONNX (paddle2onnx), output `logits`
- `validate_parity` — the parity gate: tokenizer ids, logits within atol/rtol, label sets
- `evaluate_quality` — the quality gate: the serving graph and the served champion (re-scored from
  its published files) on the same labeled eval set (`eval_set`, else the checkpoint's own
  `test`/`dev` file); refuses a candidate below a floor or worse than the champion beyond the
  rules (`max_f1_drop`, per level, per label; `max_profile_f1_drop` vs fp32). Evidence:
  `quality/evaluation.json`, `bad_cases.tsv`, `labels.png`, the MLflow run (`seqcls.gates`)
- `register_model` — MLflow model version + alias `candidate` (extra link *MLflow model version*)
- `publish_repository` — new immutable Triton version N of the four models; nothing live changes
- `reload_triton` — every Triton endpoint loads N beside the served version as the *candidate*
  (recorded state first, then reconciled); unpinned clients of `seqcls` still get the served one
- `smoke_test` — the golden texts through the candidate route `seqcls_candidate` (gRPC) answer
  what the parity gate validated
- `approve_release` — only for a model with `approval: required` in the models file: Airflow's
  human-in-the-loop `ApprovalOperator` (the *Required actions* page, or `PATCH .../taskInstances/
  approve_release/-1/hitlDetails` with `{"chosen_options": ["Approve"]}`) shows the quality gate's
  verdict and numbers (candidate vs champion micro/macro-F1, the eval set, failed and skipped rules)
  and the smoke result, read from the release workspace. *Approve*: expose and promote run.
  *Reject* — or no answer within 24 h — fails it: `rollback` withdraws the candidate as after a
  failed smoke test (served version and champion unchanged) and the run ends failed. While it
  waits, the release lease is held for the whole wait, so `seqcls_sync` leaves the candidate alone.
- `expose_version` — the public ensemble `seqcls` serves N on every endpoint, the old version
  kept warm (extra link *Triton model*)
- `promote` — alias `champion` → this version, which is now served (`previous-champion` kept)
- `rollback` — only when `register_model`, `publish_repository`, `reload_triton`, `smoke_test`,
  `approve_release` or `expose_version` **failed** (or was killed: Airflow's SIGTERM): this attempt's candidate is
  withdrawn and its registry changes reverted (a version it created, the `candidate` alias it moved;
  never `champion` — each change is journalled before it is made); what was served never changed.
  The run still ends failed. A failure before register leaves nothing to undo: rollback is skipped.
  If an endpoint dies during `expose_version`, the recorded state already says N and
  `seqcls_sync` finishes the switch. A failed `promote` (MLflow unreachable) is not rolled back:
  the smoke-tested version keeps serving, and a re-run (or `seqcls_sync`) moves the alias.
- `report_outcome` — last, after every other task whatever happened (a *teardown*: it never decides the
  run's state, so a failed release still ends failed): tells the model's `notify` URLs from the models
  file (Apprise: mail, chat, webhooks; and/or the Apprise Connection `notify_conn_id`) how the run ended —
  promoted as "Triton vN (MLflow vM)"; refused at preflight, by a gate or by the approver, with the reason;
  failed at which task, and whether the candidate was withdrawn. A run skipped as already champion sends
  nothing (the task is skipped too). A notification that cannot be sent is a warning in its log, never a
  failure. Without a models file the URLs are `SEQCLS_NOTIFY_URLS` (space-separated), as for the CLI.

**Params** (trigger form): `checkpoint` is a directory under the model's checkpoints root (absolute,
or relative to it) or `latest`; it must resolve (symlinks followed) inside that root, else
`resolve_checkpoint` fails naming the param. The root is the deployment's — the model's
`checkpoints_root` in the models file, under `SEQCLS_CHECKPOINTS_ROOT` — handed to every task when
this file is parsed (task argument `checkpoints_root`), never a run param. The rest are release
parameters validated by `seqcls.config.ReleaseConfig` (a bad value fails `resolve_checkpoint`,
naming the param) plus the Connections to use: `triton_conn_id` (extras `grpc_endpoints`,
`http_endpoints`, `repository`; password = the model-control key) and `mlflow_conn_id` (extra
`tracking_uri`, or schema/host/port; login/password or a token — never in the URI). Their
passwords and tokens are masked in task logs and never written to XCom, the release workspace or
MLflow. A missing Connection falls back to the `SEQCLS_*` environment / the local embedded setup.

**Schedule** — the model's `schedule` in the models file (else `SEQCLS_SCHEDULE`), at parse
time: unset/`manual` = manual only (releases are deliberate); a cron expression or preset
(`@daily`) = scheduled; `asset` = runs when the training pipeline updates the Asset
`seqcls://checkpoints/<model>` (`outlets=[Asset(uri=...)]`, or `POST /api/v2/assets/events`).
Scheduled and asset-triggered runs always release `latest` (under the model's `checkpoints_root`)
and end with every task **skipped** (run state success, nothing re-released) when it already is
the champion — manual runs too, unless `skip_if_champion` is off (e.g. to reload a restarted Triton).

**Champion Asset** — a successful `promote` emits `seqcls://models/<model>/champion` with extra
`{version, triton_version, fingerprint}` (MLflow version, Triton version, checkpoint sha256);
schedule downstream DAGs on it (`schedule=[Asset(uri="seqcls://models/<model>/champion")]`) and
read the extra from `triggering_asset_events`. Skipped or failed runs emit nothing.

**One release at a time, per model; models in parallel** — the serving steps take the model's
release lease (a record next to the model repository, shared by every worker that mounts it) as
this DAG run; its later tasks re-enter it, another run of another checkpoint waits for it (then
fails naming the holder). `max_active_runs=1` additionally queues this DAG's runs behind each
other; each model has its own DAG, so alpha and beta release at the same time onto one Triton,
each under its own Triton names (`seqcls.contract.names`).

**Heavy steps elsewhere** — `SEQCLS_PADDLE_PYTHON` at parse time: export/convert/validate run
through `@task.external_python` in that interpreter (seqcls must be installed there; Airflow
need not be), else in the worker's own.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, TriggerRule, chain, task
from airflow.sdk.exceptions import AirflowTimetableInvalid

from seqcls.airflow.assets import champion_asset, checkpoints_asset
from seqcls.airflow.context import RESOLVE_TASK, ROLLBACK_ON
from seqcls.airflow.models_file import ASSET_SCHEDULE, ModelSpec, release_models
from seqcls.airflow.outcome import REPORT_TASK, records_failure
from seqcls.airflow.params import dag_params
from seqcls.airflow.tasks import APPROVAL_TASK, ReleaseApproval
from seqcls.errors import InputError
from seqcls.settings import Settings
from seqcls.steps import STEPS, Step

#: The models this file builds a DAG for (the models file, validated; else the environment's one).
MODELS = release_models(Path(__file__).resolve().parent)
PADDLE_PYTHON = Settings.from_env().paddle_python
HEAVY_TIMEOUT = timedelta(hours=3)
SERVING_TIMEOUT = timedelta(minutes=20)

# What resolve_checkpoint resolved; empty under `airflow tasks test` (no XCom between calls),
# where every task falls back to the `checkpoint` param.
CHECKPOINT = f"{{{{ ti.xcom_pull(task_ids='{RESOLVE_TASK}', key='checkpoint') or '' }}}}"
FINGERPRINT = f"{{{{ ti.xcom_pull(task_ids='{RESOLVE_TASK}', key='fingerprint') or '' }}}}"
PARAMS_JSON = "{{ params | tojson }}"


def heavy_step(name: str, checkpoint: str, fingerprint: str, params_json: str, checkpoints_root: str) -> dict:
    """A Paddle step (export, convert, validate) as a task's body. Its source is what runs in
    SEQCLS_PADDLE_PYTHON (``@task.external_python``): imports stay inside, params arrive rendered as
    JSON (no Airflow needed there), the step arrives by name."""
    from seqcls.airflow.context import run_heavy_step

    return run_heavy_step(name, checkpoint, fingerprint, params_json, checkpoints_root)


def serving_step(name: str, checkpoint: str, fingerprint: str, checkpoints_root: str, params=None, ti=None) -> dict:
    """A step after the Paddle ones as a task's body: settings from the run's Connections, one library step."""
    from seqcls.airflow.tasks import run_task_step

    return run_task_step(name, checkpoint, fingerprint, params, ti, checkpoints_root=checkpoints_root)


def step_task(s: Step):
    """The task of step ``s`` (id and doc from the step table), called with the step's arguments.

    A heavy (Paddle) step goes through ``@task.external_python`` in SEQCLS_PADDLE_PYTHON when set — its
    failure's reason is then the step's record in the workspace — else a plain ``@task`` in the worker."""
    if s.heavy and PADDLE_PYTHON:
        deco = task.external_python(python=PADDLE_PYTHON, expect_airflow=False, execution_timeout=HEAVY_TIMEOUT)
        return deco(heavy_step).override(task_id=s.task_id, doc_md=s.help)
    body, timeout = (heavy_step, HEAVY_TIMEOUT) if s.heavy else (serving_step, SERVING_TIMEOUT)
    return task(task_id=s.task_id, doc_md=s.help, execution_timeout=timeout)(records_failure(body))


def release_dag(spec: ModelSpec) -> DAG:
    """One model's release DAG (max_active_runs=1: this model's runs queue, other models' do not)."""
    schedule = [checkpoints_asset(spec.name)] if spec.schedule == ASSET_SCHEDULE else spec.schedule
    with DAG(
        dag_id=spec.dag_id,
        schedule=schedule,
        start_date=datetime(2025, 1, 1, tzinfo=UTC),
        catchup=False,
        max_active_runs=1,
        doc_md=_doc(spec),
        params=dag_params(spec.name, spec.params, root=spec.checkpoints_root),
        default_args={"retries": 0, "execution_timeout": SERVING_TIMEOUT},
        tags=["seqcls", "release", "triton", "mlflow", f"model:{spec.name}"],
    ) as release:
        release_tasks(
            spec.name,
            spec.checkpoints_root,
            approval=spec.approval_required,
            notify=spec.notify,
            notify_conn_id=spec.notify_conn_id,
        )
    try:
        release.timetable.validate()
    except AirflowTimetableInvalid as exc:  # name the file and the model, not only Airflow's words
        raise InputError(f"{spec.where()}: schedule {spec.schedule!r} is not a valid cron expression: {exc}") from exc
    return release


def _doc(spec: ModelSpec) -> str:
    source = f"models file `{spec.source}`" if spec.source else "the environment (no models file)"
    schedule = {None: "manual", ASSET_SCHEDULE: f"Asset `{checkpoints_asset(spec.name).uri}`"}.get(
        spec.schedule, f"`{spec.schedule}`"
    )
    approval = f"; a person approves each release (`{APPROVAL_TASK}`)" if spec.approval_required else ""
    targets = len(spec.notify) + bool(spec.notify_conn_id)  # how many, never which: URLs may hold secrets
    notify = f"; `{REPORT_TASK}` notifies {targets} Apprise target(s)" if targets else ""
    head = (
        f"**Model `{spec.name}`** (from {source}) — schedule {schedule}{approval}{notify}; promote emits "
        f"`{champion_asset(spec.name).uri}`."
    )
    title, rest = __doc__.strip().split("\n", 1)
    return f"{title}\n\n{head}\n{rest}"


def release_tasks(
    model_name: str,
    checkpoints_root: str = "",
    *,
    approval: bool = False,
    notify: tuple[str, ...] = (),
    notify_conn_id: str | None = None,
) -> None:
    """The release checklist's tasks for ``model_name``, in the DAG being defined (promote emits its champion).

    ``checkpoints_root`` (the models file's, as written there) reaches every task as an argument fixed
    at parse time — the only root a run's checkpoint may come from (``seqcls.airflow.roots``).
    ``approval`` (models file ``approval: required``): the human approval task between smoke and expose.
    ``notify`` (Apprise URLs) and ``notify_conn_id`` (an Apprise Connection): where ``report_outcome`` sends
    the run's outcome. The URLs reach it through its closure, not as an argument: arguments are serialized
    with the DAG and shown in the UI, and the URLs may carry secrets.
    """

    @task(execution_timeout=timedelta(minutes=10))
    @records_failure
    def resolve_checkpoint(checkpoints_root: str, params=None, dag_run=None, ti=None) -> dict:
        """Validate params + checkpoint before any heavy work; skip when it already is champion."""
        from seqcls.airflow.tasks import resolve_release

        return resolve_release(model_name, checkpoints_root, params, dag_run, ti)

    @task(outlets=[champion_asset(model_name)])
    @records_failure
    def promote(
        checkpoint: str, fingerprint: str, checkpoints_root: str, params=None, ti=None, outlet_events=None
    ) -> dict:
        """Alias `champion` → this version (it is served now); the one it replaces becomes `previous-champion`.
        Emits the champion Asset with {version, triton_version, fingerprint} (only when this task succeeds)."""
        from seqcls.airflow.tasks import promote_champion

        return promote_champion(
            model_name, checkpoint, fingerprint, params, ti, outlet_events, checkpoints_root=checkpoints_root
        )

    @task(trigger_rule=TriggerRule.ONE_FAILED)
    @records_failure
    def rollback(checkpoint: str, fingerprint: str, checkpoints_root: str, params=None, ti=None) -> dict:
        """After a serving step FAILED (not merely upstream-failed): withdraw this attempt's candidate."""
        from seqcls.airflow.tasks import roll_back_failed_attempt

        return roll_back_failed_attempt(checkpoint, fingerprint, params, ti, checkpoints_root=checkpoints_root)

    @task(task_id=REPORT_TASK, execution_timeout=timedelta(minutes=5))
    def report_outcome(checkpoint: str, fingerprint: str, checkpoints_root: str, params=None, ti=None) -> dict:
        """How the run ended (promoted / refused and why / failed, withdrawn) → the model's notify URLs; never fails."""
        from seqcls.airflow.outcome import report_run

        kwargs = {"checkpoints_root": checkpoints_root, "urls": notify, "conn_id": notify_conn_id}
        return report_run(model_name, fingerprint, params, ti, **kwargs)

    step = {"checkpoint": CHECKPOINT, "fingerprint": FINGERPRINT, "checkpoints_root": checkpoints_root}
    # A person decides after the smoke test (models file `approval: required`); a rejection fails the task.
    approve = [ReleaseApproval(task_id=APPROVAL_TASK, **step)] if approval else []
    tasks = [resolve_checkpoint(checkpoints_root=checkpoints_root)]
    for s in STEPS:  # the checklist is the step table, in its order
        if s.name == "expose":
            tasks += approve
        if s.name == "promote":
            tasks.append(promote(**step))
        elif s.heavy:
            tasks.append(step_task(s)(name=s.name, params_json=PARAMS_JSON, **step))
        else:
            tasks.append(step_task(s)(name=s.name, **step))
    chain(*tasks)
    # Rollback after the steps the table marks undo_on_failure (the task checks they really failed), and
    # after a rejected approval: the candidate is withdrawn as after a failed smoke test.
    undo_on = [t for t in tasks if t in approve or t.operator.task_id in ROLLBACK_ON]
    rolled_back = rollback(**step)
    undo_on >> rolled_back
    # After everything, whatever happened; a teardown, so the run's state stays the release's (see the doc).
    [*tasks, rolled_back] >> report_outcome(**step).as_teardown()


for _spec in MODELS:
    release_dag(_spec)
