"""The DAG driven the way people drive it — the Airflow UI in a real headless Chromium and the REST API —
on one stack: log in, trigger seqcls_release through the params form with a checkpoint, wait for the
run to succeed, keep screenshots; over REST (SimpleAuthManager, POST /auth/token): the schema refuses a
bad conf, the run's task states, the plugin's extra links and a task log; then every component is
stopped with SIGINT and nothing may be left running or listening. Every wait is bounded.

One stack and one release serve both the browser and the REST client (each costs an api-server,
scheduler, dag-processor and a release through the LocalExecutor: the suite's budget): the form's
trigger *is* the REST call ``POST /api/v2/dags/seqcls_release/dagRuns``, asserted here from the
answer the browser received.

While the run works, the same session checks the provider's Connection form (issue 14): type
``triton`` shows its fields (gRPC/HTTP endpoints, repository, the password as the model-control
key), saves them under the extra keys the hooks read, and the list's *Test* button
(``AIRFLOW__CORE__TEST_CONNECTION=Enabled``) runs ``TritonHook.test_connection`` in the api-server
against the real local Triton: success, and a clear failure for a wrong key.

Uses Debian's ``chromium`` through Playwright's ``executable_path`` (no browser download) and the
same launcher as ``make airflow-ui`` (api-server, scheduler, dag-processor, triggerer on loopback,
LocalExecutor, sqlite; started from the session's migrated database), a real local Triton as the
`triton_default` connection, MLflow on sqlite under SEQCLS_HOME.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import requests

from seqcls.localtriton import free_ports
from seqcls.serving.repository import Repository
from seqcls.settings import PROJECT_ROOT
from seqcls_tools.demo.stack import DEFAULT_PASSWORD, USER, AirflowStack
from tests.helpers.airflow import airflow_db, listening, seed_migrated_db, stop_components
from tests.helpers.triton import settings_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]
__all__ = ["airflow_db"]  # the session's migrated Airflow database, the fixture imported for this module
DAG_ID = "seqcls_release"

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = PROJECT_ROOT / "var" / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _wait(predicate, timeout: float, what: str, interval: float = 2.0, stack: AirflowStack | None = None):
    """``predicate()``'s first truthy value (exceptions count as not yet); fails after ``timeout``, or at
    once when a component of ``stack`` has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, proc in (stack.procs if stack else {}).items():
            if proc.poll() is not None:
                pytest.fail(f"airflow {name} exited {proc.returncode} while waiting for {what}\n{_log_tail(stack)}")
        try:
            value = predicate()
        except Exception:
            value = None
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}" + (f"\n{_log_tail(stack)}" if stack else ""))


def _log_tail(stack: AirflowStack, n: int = 40) -> str:
    out = []
    for name in stack.procs:
        path = stack.logs / f"{name}.log"
        lines = path.read_text(errors="replace").splitlines()[-n:] if path.exists() else []
        out.append(f"--- {name} ---\n" + "\n".join(line[:300] for line in lines))
    return "\n".join(out)


def _rest(stack: AirflowStack, method: str, path: str, body: dict | None = None, token: str | None = None):
    """A raw REST call (status codes asserted by the caller), with the bearer token unless ``token`` is None."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.request(method, stack.url + path, json=body, headers=headers, timeout=30)


def _add_triton_connection(page, stack: AirflowStack, server, conn_id: str) -> None:
    """The Add Connection form for type ``triton``: its fields, filled, saved."""
    cfg = server.config
    page.goto(f"{stack.url}/connections")
    page.get_by_role("button", name="Add Connection").click()
    form = page.get_by_role("dialog")
    form.locator("input[name=connection_id]").fill(conn_id)
    form.get_by_role("combobox").click()
    page.keyboard.type("Triton")
    page.keyboard.press("Enter")
    for label in ("gRPC host (one replica)", "gRPC port", "Model-control key"):  # the relabelled standard fields
        assert form.get_by_text(label, exact=True).is_visible(), label
    assert form.locator("input[name=login]").count() == 0 and form.locator("input[name=schema]").count() == 0
    form.locator("input[name=host]").fill("127.0.0.1")
    form.locator("input[name=port]").fill(str(cfg.grpc_port))
    form.locator("input[name=password]").fill(server.control_key)
    form.get_by_role("button", name="Extra Fields", exact=True).click()
    for label in ("gRPC endpoints", "HTTP endpoints", "Model repository path"):  # the provider's conn-fields
        assert form.get_by_text(label, exact=True).is_visible(), label
    form.locator("#element_grpc_endpoints").fill(cfg.grpc_url)
    form.locator("#element_http_endpoints").fill(cfg.http_url)
    form.locator("#element_repository").fill(str(cfg.repository))
    page.screenshot(path=str(ARTIFACTS / "airflow-ui-triton-connection-form.png"), full_page=True)
    form.get_by_role("button", name="Save").click()
    form.wait_for(state="hidden", timeout=30_000)


def _test_from_the_list(page, conn_id: str) -> dict:
    """Click the row's *Test Connection*; the api-server's answer, which the toast must show."""
    row = page.get_by_role("row").filter(has_text=conn_id)
    with page.expect_response("**/api/v2/connections/test", timeout=60_000) as answer:
        row.get_by_role("button", name="Test Connection").click()
    result = answer.value.json()
    assert answer.value.status == 200, result
    title = "Test Connection Successful" if result["status"] else "Test Connection Failed"
    page.get_by_text(title).last.wait_for(timeout=10_000)
    page.get_by_text(result["message"][:60]).last.wait_for(timeout=10_000)
    return result


def _check_triton_connection_form(page, stack: AirflowStack, server, token: str) -> None:
    t0 = time.perf_counter()
    _add_triton_connection(page, stack, server, "ui_triton")
    saved = stack.api("GET", "/api/v2/connections/ui_triton", token=token)
    assert saved["conn_type"] == "triton" and saved["password"] == "***", saved
    assert json.loads(saved["extra"]) == {  # the extra keys the hooks always read
        "grpc_endpoints": server.config.grpc_url,
        "http_endpoints": server.config.http_url,
        "repository": str(server.config.repository),
    }
    ok = _test_from_the_list(page, "ui_triton")
    page.screenshot(path=str(ARTIFACTS / "airflow-ui-triton-connection-test.png"), full_page=True)
    assert ok["status"] and "model control accepted the key" in ok["message"], ok
    assert server.control_key not in ok["message"]
    wrong = {**{k: saved[k] for k in ("conn_type", "host", "port", "extra")}, "password": "w" * 32}
    stack.api("POST", "/api/v2/connections", {"connection_id": "ui_triton_wrong_key", **wrong}, token=token)
    page.reload()
    failed = _test_from_the_list(page, "ui_triton_wrong_key")
    assert not failed["status"] and "the control key sent is wrong" in failed["message"], failed
    print(f"\nUI Triton connection form + 2 tests: {time.perf_counter() - t0:.1f}s")


def test_trigger_release_from_the_ui_and_check_it_over_the_rest_api(
    server, airflow_db: Path, tiny_checkpoint: Path, home: Path, tmp_path: Path
) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed: run `bash scripts/system-deps.sh` (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    settings = settings_for(server, home)
    checkpoint = settings.checkpoints_root / "run-1"  # under the checkpoints root, as every run's must be
    shutil.copytree(tiny_checkpoint, checkpoint)
    port, worker_log, trigger_log = free_ports(3)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    stack = AirflowStack(tmp_path / "demo", settings, port=port, log_ports=(worker_log, trigger_log))
    stack.env["AIRFLOW__CORE__TEST_CONNECTION"] = "Enabled"  # Airflow 3 disables the Test button by default
    seed_migrated_db(Path(stack.env["AIRFLOW_HOME"]) / "airflow.db", airflow_db)
    runs = f"/api/v2/dags/{DAG_ID}/dagRuns"
    stopped = stuck = None
    with stack:
        try:
            # REST: log in (SimpleAuthManager), the DAG parsed without import errors, unpaused
            assert _rest(stack, "GET", "/api/v2/monitor/health").ok
            resp = _rest(stack, "POST", "/auth/token", {"username": USER, "password": DEFAULT_PASSWORD})
            assert resp.status_code in (200, 201), resp.text
            token = resp.json()["access_token"]
            assert _rest(stack, "GET", "/api/v2/dags", token=token).status_code == 200
            _wait(lambda: _rest(stack, "GET", f"/api/v2/dags/{DAG_ID}", token=token).ok, 120,
                  "the dag-processor to parse seqcls_release", stack=stack)  # fmt: skip
            errors = _rest(stack, "GET", "/api/v2/importErrors", token=token).json()
            assert errors["total_entries"] == 0, errors
            resp = _rest(stack, "PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False}, token=token)
            assert resp.ok and resp.json()["is_paused"] is False, resp.text
            bad_conf = {"checkpoint": str(checkpoint), "opset": 99}
            bad = _rest(stack, "POST", runs, {"logical_date": None, "conf": bad_conf}, token=token)
            assert bad.status_code == 400 and "opset" in bad.text, bad.text  # the trigger form's schema

            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(stack.url, timeout=60_000)
                page.get_by_label("Username").fill(USER)
                page.get_by_label("Password").fill(DEFAULT_PASSWORD)
                page.get_by_role("button", name="Sign in").click()
                page.wait_for_url(f"{stack.url}/", timeout=30_000)

                page.goto(f"{stack.url}/dags/{DAG_ID}")
                page.get_by_role("button", name="Trigger").first.click()
                form = page.get_by_role("dialog")
                field = form.locator("#element_checkpoint")
                field.fill(str(checkpoint))
                page.screenshot(path=str(ARTIFACTS / "airflow-ui-trigger-form.png"))
                with page.expect_response(lambda r: r.url.endswith("/dagRuns") and r.request.method == "POST") as sent:
                    form.get_by_role("button", name="Trigger").last.click()
                # the form's trigger is the REST call: POST dagRuns with the conf → 200, a run id
                assert sent.value.status == 200, sent.value.text()
                triggered = sent.value.json()
                run_id = triggered["dag_run_id"]
                assert triggered["conf"]["checkpoint"] == str(checkpoint), triggered
                t_run = time.perf_counter()
                _check_triton_connection_form(page, stack, server, token)  # while the run works

                def finished():
                    state = _rest(stack, "GET", f"{runs}/{run_id}", token=token).json()["state"]
                    return state if state in ("success", "failed") else None

                state = _wait(finished, 600, "the triggered run to finish", interval=3, stack=stack)
                run_seconds = time.perf_counter() - t_run
                page.goto(f"{stack.url}/dags/{DAG_ID}/runs/{run_id}")
                page.wait_for_timeout(3000)
                page.screenshot(path=str(ARTIFACTS / "airflow-ui-run.png"), full_page=True)
                browser.close()

            run = _rest(stack, "GET", f"{runs}/{run_id}", token=token).json()
            tis = _rest(stack, "GET", f"{runs}/{run_id}/taskInstances", token=token).json()["task_instances"]
            states = {t["task_id"]: t["state"] for t in tis}
            durations = ", ".join(f"{t['task_id']} {t.get('duration') or 0:.1f}s" for t in tis)
            print(f"\ntriggered run {state} in {run_seconds:.0f}s (tasks: {durations})")
            assert state == "success", f"{states}\n{_log_tail(stack)}"
            assert run["conf"]["checkpoint"] == str(checkpoint)  # the form's value reached the run
            assert states.pop("rollback") == "skipped" and set(states.values()) == {"success"}, states

            # REST: the plugin's extra links and a task's log
            links = _rest(stack, "GET", f"{runs}/{run_id}/taskInstances/reload_triton/links", token=token).json()
            triton_link = f"http://{server.config.http_url}/v2/models/seqcls/versions/1"
            assert links["extra_links"]["Triton model"] == triton_link, links
            assert links["extra_links"]["MLflow model version"] is None  # sqlite MLflow has no UI to link to
            log = _rest(stack, "GET", f"{runs}/{run_id}/taskInstances/smoke_test/logs/1", token=token)
            assert log.ok and "smoke figures: version=1, texts=65" in log.text, log.text[-2000:]
        finally:
            # Ctrl-C's SIGINT to each component; the stack's own stop() then finds them gone
            procs = dict(stack.procs)
            stopped, stuck = stop_components(procs)
    print(f"UI + REST test total {time.perf_counter() - t_start:.0f}s; stop: {stopped}; second signal: {stuck}")
    # a component that needed the second signal (the upstream hang in stop_components) must still have exited
    want = {**{name: 0 for name in procs}, "leftover_processes": 0}
    want.update({name: stopped[name] for name in stuck if stopped[name] is not None})
    assert stopped == want, f"{stopped}\n{stuck}"
    assert listening({port, worker_log, trigger_log}) == []
    assert Repository.from_settings(settings, "seqcls").serving_version() == 1
    assert (ARTIFACTS / "airflow-ui-run.png").read_bytes()[:4] == b"\x89PNG"
