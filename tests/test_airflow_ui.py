"""The Airflow UI path in a real headless Chromium: log in, trigger seqcls_release through the
params form with a checkpoint, wait for the run to succeed, keep screenshots.

Uses Debian's ``chromium`` through Playwright's ``executable_path`` (no browser download) and the
same launcher as ``make airflow-ui`` (api-server, scheduler, dag-processor, triggerer on loopback).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from seqcls.localtriton import free_ports
from seqcls.serving.repository import Repository
from seqcls.settings import PROJECT_ROOT
from seqcls_tools.demo.stack import DEFAULT_PASSWORD, USER, AirflowStack
from tests.conftest import settings_for

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


def test_trigger_release_from_the_ui(server, tiny_checkpoint: Path, home: Path, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed: run `bash scripts/system-deps.sh` (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    settings = settings_for(server, home)
    checkpoint = settings.checkpoints_root / "run-1"  # under the checkpoints root, as every run's must be
    shutil.copytree(tiny_checkpoint, checkpoint)
    port, worker_log, trigger_log = free_ports(3)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with AirflowStack(tmp_path / "demo", settings, port=port, log_ports=(worker_log, trigger_log)) as stack:
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
            form.get_by_role("button", name="Trigger").last.click()

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
