"""The Airflow UI path in a real headless Chromium: log in, trigger seqcls_release through the
params form with a checkpoint, wait for the run to succeed, keep screenshots.

While the run works, the same session (one api-server: the suite's budget) checks the provider's
Connection form (issue 14): type ``triton`` shows its fields (gRPC/HTTP endpoints, repository, the
password as the model-control key), saves them under the extra keys the hooks read, and the list's
*Test* button (``AIRFLOW__CORE__TEST_CONNECTION=Enabled``) runs ``TritonHook.test_connection`` in the
api-server against the real local Triton: success, and a clear failure for a wrong key.

Uses Debian's ``chromium`` through Playwright's ``executable_path`` (no browser download) and the
same launcher as ``make airflow-ui`` (api-server, scheduler, dag-processor, triggerer on loopback).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from seqcls.localtriton import free_ports
from seqcls.serving.repository import Repository
from seqcls.settings import PROJECT_ROOT
from seqcls_tools.demo.stack import DEFAULT_PASSWORD, USER, AirflowStack
from tests.helpers.triton import settings_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]

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


def _wait(predicate, timeout: float, what: str, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


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


def test_trigger_release_from_the_ui(server, tiny_checkpoint: Path, home: Path, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed: run `bash scripts/system-deps.sh` (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    settings = settings_for(server, home)
    checkpoint = settings.checkpoints_root / "run-1"  # under the checkpoints root, as every run's must be
    shutil.copytree(tiny_checkpoint, checkpoint)
    port, worker_log, trigger_log = free_ports(3)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    stack = AirflowStack(tmp_path / "demo", settings, port=port, log_ports=(worker_log, trigger_log))
    stack.env["AIRFLOW__CORE__TEST_CONNECTION"] = "Enabled"  # Airflow 3 disables the Test button by default
    with stack:
        token = stack.token()

        def dag_parsed():
            try:
                return stack.api("GET", "/api/v2/dags/seqcls_release", token=token)
            except Exception:
                return None

        _wait(dag_parsed, 120, "the dag-processor to parse seqcls_release")
        stack.api("PATCH", "/api/v2/dags/seqcls_release", {"is_paused": False}, token=token)

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(stack.url, timeout=60_000)
            page.get_by_label("Username").fill(USER)
            page.get_by_label("Password").fill(DEFAULT_PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"{stack.url}/", timeout=30_000)

            page.goto(f"{stack.url}/dags/seqcls_release")
            page.get_by_role("button", name="Trigger").first.click()
            form = page.get_by_role("dialog")
            field = form.locator("#element_checkpoint")
            field.fill(str(checkpoint))
            page.screenshot(path=str(ARTIFACTS / "airflow-ui-trigger-form.png"))
            with page.expect_response(lambda r: r.url.endswith("/dagRuns") and r.request.method == "POST"):
                form.get_by_role("button", name="Trigger").last.click()
            _check_triton_connection_form(page, stack, server, token)  # while the run works

            def finished_run():
                runs = stack.api("GET", "/api/v2/dags/seqcls_release/dagRuns", token=token)["dag_runs"]
                done = [r for r in runs if r["state"] in ("success", "failed")]
                return done[0] if done else None

            run = _wait(finished_run, 600, "the triggered run to finish", interval=5)
            page.goto(f"{stack.url}/dags/seqcls_release/runs/{run['dag_run_id']}")
            page.wait_for_timeout(3000)
            page.screenshot(path=str(ARTIFACTS / "airflow-ui-run.png"), full_page=True)
            browser.close()

        tasks = stack.api("GET", f"/api/v2/dags/seqcls_release/dagRuns/{run['dag_run_id']}/taskInstances", token=token)[
            "task_instances"
        ]
        states = {t["task_id"]: t["state"] for t in tasks}
        assert run["state"] == "success", states
        assert run["conf"]["checkpoint"] == str(checkpoint)  # the form's value reached the run
        assert states["promote"] == "success" and states["rollback"] == "skipped"
    assert Repository.from_settings(settings, "seqcls").serving_version() == 1
    assert (ARTIFACTS / "airflow-ui-run.png").read_bytes()[:4] == b"\x89PNG"
