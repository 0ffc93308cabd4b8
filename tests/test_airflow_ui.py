"""The DAG driven the way people drive it — the Airflow UI in a real headless Chromium and the REST API —
on one stack: log in, trigger seqcls_release through the params form with a checkpoint, wait for the
run to succeed, keep screenshots; over REST (SimpleAuthManager, POST /auth/token): the schema refuses a
bad conf, the run's task states, the plugin's extra links and a task log; then every component is
stopped with SIGINT and nothing may be left running or listening. Every wait is bounded.

The form cannot lie (issue 25): it opens with the everyday params, the gates' tolerances and the
expert knobs folded in their own sections; ``1e-8`` typed into *Parity atol* reaches the run's conf
and the parity gate exactly (Airflow's number widget sent ``1``). After the run, the seqcls pages in
the same browser: the parity and quality evidence (verdict above the plot, a working link back to
the Airflow run), the same pages as tabs of the DAG run, the model's history — each screenshotted
into ``var/test-artifacts/`` (and ``SEQCLS_SCREENSHOTS_DIR`` when set, for a report).

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
import os
import re
import shutil
import time
import warnings
from pathlib import Path
from urllib.parse import quote

import pytest
import requests

from seqcls.config import EXPERT_SECTION, GATE_SECTION
from seqcls.contract.names import ModelName
from seqcls.localtriton import free_ports
from seqcls.serving.repository import Repository
from seqcls.settings import PROJECT_ROOT
from seqcls_tools.demo.stack import DEFAULT_PASSWORD, USER, AirflowStack
from tests.helpers.airflow import (
    airflow_db,
    hung_in_local_executor_end,
    listening,
    seed_migrated_db,
    stop_components,
)
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


def _tail(path: Path, n: int) -> str:
    lines = path.read_text(errors="replace").splitlines()[-n:] if path.exists() else []
    return "\n".join(line[:300] for line in lines)


def _log_tail(stack: AirflowStack, n: int = 40) -> str:
    out = []
    for name in stack.procs:
        out.append(f"--- {name} ---\n" + _tail(stack.logs / f"{name}.log", n))
    return "\n".join(out)


def _shot(page, name: str, *, full_page: bool = True) -> Path:
    """A screenshot into the test artifacts (and a copy into ``SEQCLS_SCREENSHOTS_DIR`` when set)."""
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=full_page)
    extra = os.environ.get("SEQCLS_SCREENSHOTS_DIR")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, Path(extra) / name)
    return path


def _eval_set(path: Path) -> Path:
    """Labeled texts for the quality gate (JSONL), from the tiny checkpoint's corpus and labels."""
    from seqcls_tools.testing import TINY_CORPUS, TINY_LABELS

    children = [label for label in TINY_LABELS if "##" in label]
    lines = [
        json.dumps(
            {"text": text, "labels": [children[i % len(children)].split("##")[0], children[i % len(children)]]},
            ensure_ascii=False,
        )
        for i, text in enumerate(TINY_CORPUS * 6)  # 60 texts: at least the 50 a quality verdict is taken on
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _fill_the_form(page, form, checkpoint: Path) -> None:
    """The form as it opens: the everyday params shown, the gates and expert sections folded below, in
    that order; then the checkpoint, the eval set and ``1e-8`` typed into *Parity atol*."""
    sections = [form.get_by_text(title, exact=True) for title in ("Run Parameters", GATE_SECTION, EXPERT_SECTION)]
    tops = [s.bounding_box()["y"] for s in sections]
    assert tops == sorted(tops), tops
    form.locator("#element_checkpoint").wait_for(state="visible", timeout=30_000)

    def label(title: str):  # a param's label: its title, and the required mark
        return form.get_by_text(re.compile(rf"^{re.escape(title)}\s*\*?$")).first

    for everyday in ("Checkpoint", "Model name", "Serving profile", "Skip if already champion", "Eval set"):
        assert label(everyday).is_visible(), everyday  # open, without a click
    assert not label("Parity atol").is_visible()  # folded in the gates' section
    form.locator("#element_checkpoint").fill(str(checkpoint))
    form.locator("#element_eval_set").fill("eval.jsonl")  # relative to the model's checkpoints root
    sections[1].scroll_into_view_if_needed()  # the end of the everyday section, the two folded below it
    _shot(page, "airflow-ui-trigger-form.png", full_page=False)
    sections[1].click()
    atol = form.locator("#element_atol")
    atol.wait_for(state="visible", timeout=10_000)
    assert atol.evaluate("el => el.type") == "text"  # not Airflow's number widget, which rounded 1e-8 to 1
    atol.fill("1e-8")
    atol.scroll_into_view_if_needed()
    _shot(page, "airflow-ui-trigger-form-gates.png", full_page=False)


def _evidence_pages(page, stack: AirflowStack, run_id: str) -> None:
    """The gates' pages and the history in the browser: the verdict above the plot, the exact tolerance
    the run was given, the Airflow run link working; then the same pages as tabs of the DAG run."""
    run = quote(run_id, safe="")
    for gate, title in (("parity", "Parity gate passed"), ("quality", "Quality gate passed")):
        page.goto(f"{stack.url}/seqcls/{gate}/{DAG_ID}/{run}")
        verdict, plot = page.get_by_role("heading", name=title, exact=True), page.locator("img.plot")
        assert verdict.is_visible() and plot.is_visible(), page.content()[:3000]
        assert verdict.bounding_box()["y"] < plot.bounding_box()["y"]
        assert plot.evaluate("img => img.complete && img.naturalWidth > 0"), f"{gate} plot did not load"
        if gate == "parity":
            assert page.get_by_text("allowed 1e-08 + 0.001·|x|").is_visible()  # the form's 1e-8, exactly
        _shot(page, f"seqcls-{gate}-evidence.png")
    page.get_by_role("link", name="Airflow run", exact=True).click()
    page.wait_for_url(re.compile(rf"/dags/{DAG_ID}/runs/"), timeout=30_000)
    page.get_by_text(run_id).first.wait_for(timeout=30_000)  # the run's own page, not a 404
    assert page.url == f"{stack.url}/dags/{DAG_ID}/runs/{run}", page.url

    page.goto(f"{stack.url}/dags/{DAG_ID}/runs/{run}/plugin/seqcls-parity")  # the run's *Parity evidence* tab
    tab = page.frame_locator("iframe[title='Parity evidence']")
    tab.get_by_role("heading", name="Parity gate passed").wait_for(timeout=30_000)
    page.wait_for_timeout(1000)
    _shot(page, "airflow-ui-run-parity-tab.png", full_page=False)

    page.goto(f"{stack.url}/seqcls/history/seqcls")
    page.get_by_role("heading", name="seqcls serves Triton v1 (MLflow v1)").wait_for(timeout=30_000)
    rows = page.locator("table.history tr")
    assert rows.count() >= 4, page.content()[:3000]  # header, candidate, expose, promote
    _shot(page, "seqcls-history.png")
    page.locator("table.history").get_by_role("link", name="Airflow run").first.click()
    page.wait_for_url(re.compile(rf"/dags/{DAG_ID}/runs/"), timeout=30_000)
    page.get_by_text(run_id).first.wait_for(timeout=30_000)
    page.goto(f"{stack.url}/seqcls/history")
    page.get_by_role("link", name="seqcls", exact=True).wait_for(timeout=30_000)
    _shot(page, "seqcls-history-index.png")
    page.goto(stack.url)  # the history in Airflow's Browse menu
    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="Release history").click()
    page.frame_locator("iframe[title='Release history']").get_by_role("heading", name="Serving history").wait_for(
        timeout=30_000
    )
    _shot(page, "airflow-ui-browse-release-history.png", full_page=False)


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
    for label in ("gRPC endpoints", "HTTP endpoints", "Model repository", "Object store connection"):  # conn-fields
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
        "store_conn_id": None,  # left empty in the form: saved as null, read as unset (aws_default)
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
    _eval_set(settings.checkpoints_root / "eval.jsonl")
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
            typo = {"checkpoint": str(checkpoint), "atol": "1e-8x"}
            bad = _rest(stack, "POST", runs, {"logical_date": None, "conf": typo}, token=token)
            assert bad.status_code == 400 and "atol" in bad.text, bad.text  # a tolerance is a number, as text

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
                _fill_the_form(page, form, checkpoint)
                with page.expect_response(lambda r: r.url.endswith("/dagRuns") and r.request.method == "POST") as sent:
                    form.get_by_role("button", name="Trigger").last.click()
                # the form's trigger is the REST call: POST dagRuns with the conf → 200, a run id
                assert sent.value.status == 200, sent.value.text()
                triggered = sent.value.json()
                run_id = triggered["dag_run_id"]
                assert triggered["conf"]["checkpoint"] == str(checkpoint), triggered
                assert triggered["conf"]["atol"] == "1e-8" and float(triggered["conf"]["atol"]) == 1e-8, triggered
                t_run = time.perf_counter()
                _check_triton_connection_form(page, stack, server, token)  # while the run works

                def finished():
                    state = _rest(stack, "GET", f"{runs}/{run_id}", token=token).json()["state"]
                    return state if state in ("success", "failed") else None

                state = _wait(finished, 600, "the triggered run to finish", interval=3, stack=stack)
                run_seconds = time.perf_counter() - t_run
                page.goto(f"{stack.url}/dags/{DAG_ID}/runs/{run_id}")
                page.wait_for_timeout(3000)
                _shot(page, "airflow-ui-run.png")
                if state == "success":
                    t_pages = time.perf_counter()
                    _evidence_pages(page, stack, run_id)
                    print(f"\nseqcls pages in the browser: {time.perf_counter() - t_pages:.1f}s")
                browser.close()

            run = _rest(stack, "GET", f"{runs}/{run_id}", token=token).json()
            tis = _rest(stack, "GET", f"{runs}/{run_id}/taskInstances", token=token).json()["task_instances"]
            states = {t["task_id"]: t["state"] for t in tis}
            durations = ", ".join(f"{t['task_id']} {t.get('duration') or 0:.1f}s" for t in tis)
            print(f"\ntriggered run {state} in {run_seconds:.0f}s (tasks: {durations})")
            assert state == "success", f"{states}\n{_log_tail(stack)}"
            assert run["conf"]["checkpoint"] == str(checkpoint)  # the form's value reached the run
            assert run["conf"]["atol"] == "1e-8"
            plugins = _rest(stack, "GET", "/api/v2/plugins", token=token).json()["plugins"]
            views = {v["name"]: v for p in plugins if p["name"] == "seqcls" for v in p["external_views"]}
            assert {"Parity evidence", "Quality evidence", "Release history"} <= set(views), plugins
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
    # a component that needed the second signal (the upstream hang in stop_components) must still have exited,
    # unless it is the scheduler stuck joining idle LocalExecutor workers (apache/airflow#67870): reported, not ours
    want = {**{name: 0 for name in procs}, "leftover_processes": 0}
    want.update({name: stopped[name] for name in stuck if stopped[name] is not None})
    scheduler_log = stack.logs / "scheduler.log"
    if (
        stopped.get("scheduler", 0) is None
        and "scheduler" in stuck
        and hung_in_local_executor_end(stuck["scheduler"], scheduler_log.read_text(errors="replace"))
    ):
        want["scheduler"] = None
        warnings.warn(
            f"the scheduler hung in LocalExecutor.end() (apache/airflow#67870): {stuck['scheduler']}", stacklevel=1
        )
    hung = "".join(f"\n--- {name}.log\n" + _tail(stack.logs / f"{name}.log", 120) for name in stuck)
    assert stopped == want, f"{stopped}\n{stuck}{hung}"
    assert listening({port, worker_log, trigger_log}) == []
    assert Repository.from_settings(settings, ModelName("seqcls")).serving_version() == 1
    assert (ARTIFACTS / "airflow-ui-run.png").read_bytes()[:4] == b"\x89PNG"
