"""Issue 27: the Prometheus rules, the Grafana dashboard and their wiring into compose and Kubernetes.

Three layers, fastest first:

- pure Python (always runs): the rules file and the dashboard parse, every alert has ``for:``, a
  severity, annotations that say what to run and a minimum-traffic guard; every metric they name is
  one the contract (``model_repository/common/seqcls_contract.py``) or Triton exports, or a
  recorded rule; the compose and Kubernetes files mount the rules, provisioning and dashboard
  where the configs look for them, from one copy of each file;
- ``promtool`` (Debian's ``prometheus`` package, installed by ``scripts/system-deps.sh``): ``check
  rules``, ``check config`` of both Prometheus configs with their rule file resolved, every
  dashboard query compiled as a recording rule, and ``test rules`` on
  ``tests/data/seqcls-rules.test.yml`` (recorded values, alerts firing / not firing, the traffic
  guards);
- the real ``prometheus`` server scraping ``tests/data/triton-metrics-seqcls.txt`` — the
  ``/metrics`` text of a real local Triton serving a seqcls release — served on loopback with the
  counters growing per scrape: every recording rule and every dashboard query returns data.

Without the binaries the promtool / server tests skip locally and FAIL under CI (``CI=true``):
``make test`` installs them first.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
RULES = DOCKER / "prometheus-rules" / "seqcls.rules.yml"
PROMETHEUS_CONFIG = DOCKER / "prometheus.yml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "seqcls.json"
DATASOURCES = DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = DOCKER / "grafana" / "provisioning" / "dashboards" / "seqcls.yml"
DOCKER_KUSTOMIZATION = DOCKER / "kustomization.yaml"
COMPOSE_FILE = ROOT / "docker-compose.airflow.yml"
DEPLOY = ROOT / "deploy" / "kubernetes"
K8S_KUSTOMIZATION = DEPLOY / "kustomization.yaml"
K8S_MONITORING = DEPLOY / "monitoring.yaml"
K8S_PROMETHEUS_CONFIG = DEPLOY / "monitoring" / "prometheus.yml"
RULES_TEST = ROOT / "tests" / "data" / "seqcls-rules.test.yml"
METRICS_TEXT = ROOT / "tests" / "data" / "triton-metrics-seqcls.txt"
CONTRACT = ROOT / "model_repository" / "common" / "seqcls_contract.py"

#: What Triton exports that the rules and the dashboard may use (Triton's metrics docs).
TRITON_METRICS = {
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_cpu_utilization",
    "nv_cpu_memory_used_bytes",
    "nv_gpu_utilization",
    "nv_gpu_memory_used_bytes",
}
#: Series only a GPU Triton exports: the local (CPU) Triton's text has none.
GPU_ONLY = {"nv_gpu_utilization", "nv_gpu_memory_used_bytes"}
#: Grafana variables the dashboard may use, and what the checks put in their place.
DASHBOARD_VARIABLES = {"${model}": "seqcls", "$model": "seqcls", "$version": ".*", "$__rate_interval": "1m"}
#: Minimum-traffic guards: an alert on what a model answers must need one of these to fire.
TRAFFIC_GUARDS = (
    r"seqcls:(texts|tokenized_texts|triton_requests):rate(5m|1h)(\s*\*\s*3600)?\s*>=\s*[0-9.]+",
    r"\*\s*300\s*>=\s*\d+",  # at least N refused requests in 5 minutes
    r"increase\(seqcls_texts_total\[1h\][^)]*\)\)\s*>=\s*\d+",
)
SEVERITIES = {"warning", "critical"}
RUN_HINTS = ("`seqcls monitor --model-name {{ $labels.model }}`", "`seqcls status")
CI = os.environ.get("CI", "").lower() == "true"
PROMTOOL_TIMEOUT_S = 60


# ----------------------------------------------------------------------------- loading


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _contract() -> Any:
    spec = importlib.util.spec_from_file_location("seqcls_contract_for_rules", CONTRACT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _yaml(RULES)["groups"] for rule in group["rules"]]


def _records() -> list[dict[str, Any]]:
    return [r for r in _rules() if "record" in r]


def _alerts() -> list[dict[str, Any]]:
    return [r for r in _rules() if "alert" in r]


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows hold their panels
    return panels


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _dashboard_queries() -> list[tuple[str, str]]:
    """(``panel title / refId``, expression) of every query of the dashboard."""
    return [
        (f"{panel['title']} / {target['refId']}", target["expr"])
        for panel in _panels(_dashboard())
        for target in panel.get("targets", [])
    ]


def _substitute(expr: str) -> str:
    for variable, value in DASHBOARD_VARIABLES.items():  # ${model} before $model
        expr = expr.replace(variable, value)
    return expr


def _compose_services() -> dict[str, Any]:
    return _yaml(COMPOSE_FILE)["services"]


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Container target → (host source, read-only) of a compose service's bind mounts and volumes."""
    mounts = {}
    for entry in service.get("volumes") or []:
        parts = str(entry).split(":")
        mounts[parts[1]] = (parts[0], parts[2:] == ["ro"])
    return mounts


def _k8s_docs() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(K8S_MONITORING.read_text()) if d}


def _generators() -> dict[str, list[Path]]:
    """ConfigMap name → the files it is generated from, over both kustomizations."""
    found: dict[str, list[Path]] = {}
    for kustomization in (K8S_KUSTOMIZATION, DOCKER_KUSTOMIZATION):
        for generator in _yaml(kustomization).get("configMapGenerator", []):
            assert generator["name"] not in found, f"ConfigMap {generator['name']} generated twice"
            found[generator["name"]] = [kustomization.parent / f for f in generator["files"]]
    return found


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(?:seqcls_[a-z_]+|nv_[a-z_]+|seqcls:[a-z0-9_]+:[a-z0-9_]+)\b", expr))


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"`{name}` not on PATH (Debian: apt-get install prometheus; scripts/system-deps.sh installs it)"
        if CI:
            pytest.fail(message + " — required under CI")
        pytest.skip(message)
    return path


def _promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_binary("promtool"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_S,
        check=False,
    )


# ----------------------------------------------------------------------------- rules (pure Python)


def test_rules_file_names_are_unique_and_conventional() -> None:
    groups = _yaml(RULES)["groups"]
    assert len({g["name"] for g in groups}) == len(groups)
    records = [r["record"] for r in _records()]
    assert len(records) == len(set(records)), "a recording rule defined twice"
    for name in records:
        assert re.fullmatch(r"seqcls:[a-z0-9_]+:[a-z0-9_]+", name), f"{name}: not level:metric:operation"
    alerts = [r["alert"] for r in _alerts()]
    assert len(alerts) == len(set(alerts)) and all(a.startswith("Seqcls") for a in alerts), alerts
    for required in (
        "seqcls:label_share:rate5m",
        "seqcls:label_share:rate1h",
        "seqcls:unlabeled_share:rate5m",
        "seqcls:top_confidence:p50_rate5m",
        "seqcls:top_confidence:p90_rate5m",
        "seqcls:near_threshold_share:rate5m",
        "seqcls:truncated_share:rate5m",
        "seqcls:rejected_requests:rate5m",
        "seqcls:triton_request_error_ratio:rate5m",
        "seqcls:triton_request_latency_seconds:mean_rate5m",
    ):
        assert required in records, f"missing recording rule {required}"


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: a["alert"])
def test_alert_has_for_severity_and_what_to_run(alert: dict[str, Any]) -> None:
    assert re.fullmatch(r"\d+[smh]", str(alert.get("for", ""))), f"{alert['alert']}: no `for:` — a blip would page"
    assert alert["labels"]["severity"] in SEVERITIES
    annotations = alert["annotations"]
    assert {"summary", "description", "action"} <= set(annotations)
    assert any(hint in annotations["action"] for hint in RUN_HINTS), f"{alert['alert']}: say what to run"
    if "model" in alert["annotations"]["summary"] or "$labels.model" in annotations["summary"]:
        assert "--model-name {{ $labels.model }}" in annotations["action"]


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: a["alert"])
def test_alerts_on_model_traffic_need_a_minimum_traffic(alert: dict[str, Any]) -> None:
    """A quiet model must not page: every alert on seqcls/Triton series carries a traffic floor."""
    expr = alert["expr"]
    if not re.search(r"seqcls[_:]", expr):
        assert re.search(r'\bup\{job="triton"\}', expr), alert["alert"]  # target health only
        return
    assert any(re.search(guard, expr) for guard in TRAFFIC_GUARDS), f"{alert['alert']}: no minimum-traffic guard"


def test_rules_and_dashboard_use_only_exported_or_recorded_metrics() -> None:
    contract = _contract()
    exported = {getattr(contract, n) for n in dir(contract) if n.startswith("METRIC_") and n != "METRIC_LABELS_KEY"}
    histogram = contract.METRIC_TOP_CONFIDENCE
    exported = (exported - {histogram}) | {f"{histogram}_{suffix}" for suffix in ("bucket", "sum", "count")}
    recorded = {r["record"] for r in _records()}
    known = exported | TRITON_METRICS | recorded
    expressions = [(r.get("record") or r["alert"], r["expr"]) for r in _rules()]
    expressions += _dashboard_queries()
    for where, expr in expressions:
        unknown = _metric_names(expr) - known
        assert not unknown, f"{where}: {sorted(unknown)} is neither exported (contract / Triton) nor recorded"
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), where
    used = set().union(*(_metric_names(e) for _, e in expressions))
    assert exported <= used, f"contract metrics nobody looks at: {sorted(exported - used)}"


def test_rules_follow_the_contract_reasons_and_buckets() -> None:
    contract = _contract()
    reasons = set()
    for alert in _alerts():
        for group in re.findall(r'reason=~"([^"]+)"', alert["expr"]):
            reasons |= set(group.split("|"))
    assert reasons == set(contract.REJECT_REASONS), "client + server rejection alerts must cover every reason"
    # the unit tests feed the contract's buckets, and the contract's metric names
    text = RULES_TEST.read_text(encoding="utf-8")
    les = re.findall(r'seqcls_top_confidence_bucket\{model="seqcls",version="3",le="([^"]+)"\}', text)
    assert les == [str(b) for b in contract.CONFIDENCE_BUCKETS] + ["+Inf"]


# ----------------------------------------------------------------------------- dashboard (pure Python)


def test_dashboard_templating_and_panels() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) >= {"model", "version"}
    assert "seqcls_texts_total" in variables["model"]["definition"]
    assert '{model="$model"}' in variables["version"]["definition"] and variables["version"]["includeAll"]
    datasource_uid = _yaml(DATASOURCES)["datasources"][0]["uid"]
    panels = _panels(dashboard)
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for cell in (
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        ):
            assert cell not in cells, f"{panel['title']} overlaps {cells[cell]}"
            cells[cell] = panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"{panel['title']}: no query"
        for target in [panel, *panel["targets"]]:
            assert target["datasource"]["uid"] == datasource_uid, f"{panel['title']}: not the provisioned datasource"
        for target in panel["targets"]:
            leftover = set(re.findall(r"\$\{?\w+\}?", _substitute(target["expr"])))
            assert not leftover, f"{panel['title']}: unknown variables {leftover}"
    exprs = " ".join(e for _, e in _dashboard_queries())
    for needed in (
        "seqcls_label_predictions_total",
        "seqcls_unlabeled_texts_total",
        "seqcls_top_confidence_bucket",
        "seqcls_near_threshold_total",
        "seqcls_truncated_texts_total",
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
    ):
        assert needed in exprs, f"no panel shows {needed}"
    by_reason = r"sum by \([^)]*reason[^)]*\) \(rate\(seqcls_rejected_requests_total"
    assert re.search(by_reason, exprs), "no panel shows the rejections by reason"
    heatmaps = [p for p in panels if p["type"] == "heatmap"]
    assert heatmaps and all("seqcls_top_confidence_bucket" in t["expr"] for p in heatmaps for t in p["targets"])
    assert all(t.get("format") == "heatmap" for p in heatmaps for t in p["targets"])


def test_grafana_provisioning_matches_both_stacks() -> None:
    datasource = _yaml(DATASOURCES)["datasources"][0]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    services = _compose_services()
    assert "127.0.0.1:9090:9090" in services["prometheus"]["ports"]
    scrape = _yaml(PROMETHEUS_CONFIG)["global"]["scrape_interval"]
    assert datasource["jsonData"]["timeInterval"] == scrape, "$__rate_interval needs the scrape interval"
    provider = _yaml(DASHBOARD_PROVIDERS)["providers"][0]
    dashboards_path = provider["options"]["path"]

    grafana = services["grafana"]
    mounts = _mounts(grafana)
    assert re.fullmatch(r"grafana/grafana-oss:\d+\.\d+\.\d+", grafana["image"]), "pin a Grafana release"
    expected = {
        "/etc/grafana/provisioning/datasources": DATASOURCES.parent,
        "/etc/grafana/provisioning/dashboards": DASHBOARD_PROVIDERS.parent,
        dashboards_path: DASHBOARD.parent,
    }
    for target, source in expected.items():
        assert target in mounts, f"grafana: nothing mounted at {target}"
        host, read_only = mounts[target]
        assert (ROOT / host).resolve() == source.resolve() and read_only, f"grafana: {target} <- {host}"
    env = grafana["environment"]
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{dashboards_path}/{DASHBOARD.name}"
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == "${GRAFANA_ADMIN_PASSWORD:-}", "the admin password only from .env"
    assert "GF_SECURITY_DISABLE_INITIAL_ADMIN_CREATION=true" in " ".join(grafana["entrypoint"])
    assert grafana["ports"] == ["127.0.0.1:3000:3000"]
    assert "depends_on" not in grafana


def test_compose_prometheus_loads_the_rules_relative_to_its_config() -> None:
    prometheus = _compose_services()["prometheus"]
    config_path = next(a.split("=", 1)[1] for a in prometheus["command"] if a.startswith("--config.file="))
    mounts = _mounts(prometheus)
    assert (ROOT / mounts[config_path][0]).resolve() == PROMETHEUS_CONFIG.resolve()
    (rule_file,) = _yaml(PROMETHEUS_CONFIG)["rule_files"]
    assert (PROMETHEUS_CONFIG.parent / rule_file).resolve() == RULES.resolve(), "rule_files does not resolve here"
    in_container = Path(config_path).parent / rule_file
    host, read_only = mounts[str(in_container.parent)]
    assert (ROOT / host).resolve() == RULES.parent.resolve() and read_only, "the container would not find the rules"


# ----------------------------------------------------------------------------- Kubernetes (pure Python)


def test_kubernetes_monitoring_mounts_the_generated_configmaps() -> None:
    docs = _k8s_docs()
    generators = _generators()
    for files in generators.values():
        for path in files:
            assert path.is_file(), f"configMapGenerator file {path} missing"
    # one copy: the docker/ files are what the ConfigMaps are generated from
    assert generators["seqcls-prometheus-rules"] == [RULES]
    assert generators["seqcls-grafana-dashboards"] == [DASHBOARD]
    assert generators["seqcls-grafana-datasources"] == [DATASOURCES]
    assert generators["seqcls-grafana-dashboard-providers"] == [DASHBOARD_PROVIDERS]
    assert generators["seqcls-prometheus-config"] == [K8S_PROMETHEUS_CONFIG]
    assert "../../docker" in _yaml(K8S_KUSTOMIZATION)["resources"]

    compose = _compose_services()
    prometheus = docs[("Deployment", "prometheus")]["spec"]["template"]["spec"]
    container = prometheus["containers"][0]
    assert container["image"] == compose["prometheus"]["image"]
    config_file = next(a.split("=", 1)[1] for a in container["args"] if a.startswith("--config.file="))
    (volume,) = [v for v in prometheus["volumes"] if v["name"] == "config"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    files = {
        str(Path(mount["mountPath"]) / item["path"]): (source["configMap"]["name"], item["key"])
        for source in volume["projected"]["sources"]
        for item in source["configMap"]["items"]
    }
    (rule_file,) = _yaml(K8S_PROMETHEUS_CONFIG)["rule_files"]
    assert files[config_file] == ("seqcls-prometheus-config", K8S_PROMETHEUS_CONFIG.name)
    assert files[str(Path(config_file).parent / rule_file)] == ("seqcls-prometheus-rules", RULES.name)

    grafana = docs[("Deployment", "grafana")]["spec"]["template"]["spec"]
    container = grafana["containers"][0]
    assert container["image"] == compose["grafana"]["image"]
    volumes = {v["name"]: v for v in grafana["volumes"]}
    by_path = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    for path, source in (
        ("/etc/grafana/provisioning/datasources", "seqcls-grafana-datasources"),
        ("/etc/grafana/provisioning/dashboards", "seqcls-grafana-dashboard-providers"),
        (_yaml(DASHBOARD_PROVIDERS)["providers"][0]["options"]["path"], "seqcls-grafana-dashboards"),
    ):
        assert by_path[path]["configMap"]["name"] == source, path
    env = {e["name"]: e for e in container["env"]}
    compose_env = compose["grafana"]["environment"]
    for name, value in compose_env.items():
        if name != "GF_SECURITY_ADMIN_PASSWORD":
            assert env[name]["value"] == value, f"grafana {name}: compose and Kubernetes differ"
    secret = env["GF_SECURITY_ADMIN_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert secret["optional"] is True and "value" not in env["GF_SECURITY_ADMIN_PASSWORD"]
    # the datasource URL names this Service, in both stacks
    service = docs[("Service", "prometheus")]
    assert service["spec"]["ports"][0]["port"] == 9090 and service["metadata"]["name"] == "prometheus"


def test_kubernetes_prometheus_config_is_the_compose_one_with_dns_discovery() -> None:
    compose_config, k8s_config = _yaml(PROMETHEUS_CONFIG), _yaml(K8S_PROMETHEUS_CONFIG)
    assert k8s_config["global"] == compose_config["global"]
    assert k8s_config["rule_files"] == compose_config["rule_files"]
    (job,) = k8s_config["scrape_configs"]
    assert job["job_name"] == "triton", "the alerts select job=triton"
    (sd,) = job["dns_sd_configs"]
    triton = yaml.safe_load_all((DEPLOY / "triton.yaml").read_text())
    headless = next(d for d in triton if d and d["kind"] == "Service" and d["spec"].get("clusterIP") == "None")
    meta = headless["metadata"]
    assert sd["names"] == [f"{meta['name']}.{meta['namespace']}.svc.cluster.local"] and sd["type"] == "A"
    assert sd["port"] == next(p["port"] for p in headless["spec"]["ports"] if p["name"] == "metrics")


def test_kustomize_renders_the_configmaps_from_the_same_files() -> None:
    """`kubectl kustomize` (when installed): generated names resolve, contents are the files, strict-valid."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (optional: the structure is checked above without it)")
    import kubernetes_validate

    result = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    rendered = [d for d in yaml.safe_load_all(result.stdout) if d]
    configmaps = {d["metadata"]["name"]: d for d in rendered if d["kind"] == "ConfigMap"}
    by_base = {re.sub(r"-[a-z0-9]{10}$", "", name): cm for name, cm in configmaps.items()}
    for base, files in _generators().items():
        cm = by_base[base]
        assert cm["metadata"]["namespace"] == "seqcls"
        assert cm["data"] == {p.name: p.read_text(encoding="utf-8") for p in files}, base
    referenced = set()
    for doc in rendered:
        if doc["kind"] == "Deployment":
            for volume in doc["spec"]["template"]["spec"].get("volumes", []):
                sources = [volume, *volume.get("projected", {}).get("sources", [])]
                referenced |= {s["configMap"]["name"] for s in sources if "configMap" in s}
    assert referenced == set(configmaps), "a mounted ConfigMap is not the generated one (or one is unused)"
    for doc in rendered:
        if doc["kind"] == "ConfigMap":
            for version in ("1.31.0", "1.37.0"):
                kubernetes_validate.validate(doc, version, strict=True)


# ----------------------------------------------------------------------------- promtool


def test_promtool_check_rules() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    """The check is real: a typo'd expression fails it."""
    data = _yaml(RULES)
    data["groups"][0]["rules"][0]["expr"] = "sum by (model (rate(seqcls_texts_total[5m]))"
    broken = tmp_path / "broken.yml"
    broken.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert _promtool("check", "rules", str(broken)).returncode != 0


def test_promtool_check_config_compose() -> None:
    result = _promtool("check", "config", str(PROMETHEUS_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


def test_promtool_check_config_kubernetes(tmp_path: Path) -> None:
    """The pod's /etc/prometheus: prometheus.yml and, at its rule_files path, the rules file."""
    (rule_file,) = _yaml(K8S_PROMETHEUS_CONFIG)["rule_files"]
    shutil.copy(K8S_PROMETHEUS_CONFIG, tmp_path / "prometheus.yml")
    (tmp_path / rule_file).parent.mkdir(parents=True)
    shutil.copy(RULES, tmp_path / rule_file)
    result = _promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


def test_promtool_compiles_every_dashboard_query(tmp_path: Path) -> None:
    """Each panel's PromQL, variables substituted, as a recording rule: promtool parses all of them."""
    queries = _dashboard_queries()
    rules = [{"record": f"dashboard:query_{i}:check", "expr": _substitute(expr)} for i, (_, expr) in enumerate(queries)]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), encoding="utf-8")
    result = _promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_promtool_unit_tests() -> None:
    """Recorded values on series shaped like the exporters', alerts that fire and that must not."""
    result = _promtool("test", "rules", str(RULES_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


# ----------------------------------------------------------------------------- a real Prometheus on real metrics


def _parse_metrics_text(text: str) -> tuple[list[tuple[str, str, float]], dict[str, str]]:
    """(series name, ``{labels}`` text, value) per sample line, and each family's TYPE."""
    types, samples = {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(None, 3)
            types[family] = kind
        elif line and not line.startswith("#"):
            match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+-?\d+)?", line)
            assert match, f"not a sample line: {line!r}"
            samples.append((match.group(1), match.group(2) or "", float(match.group(3))))
    return samples, types


def _family(name: str, types: dict[str, str]) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and types.get(name[: -len(suffix)]) == "histogram":
            return name[: -len(suffix)]
    return name


class _GrowingMetrics:
    """The captured text, counters and histograms scaled by the scrape number (1, 2, 3, …): a
    Triton answering the same traffic again between scrapes. Gauges stay as captured."""

    def __init__(self, text: str) -> None:
        self.samples, self.types = _parse_metrics_text(text)
        self.scrapes = 0
        self.lock = threading.Lock()

    def render(self) -> bytes:
        with self.lock:
            self.scrapes += 1
            n = self.scrapes
        lines = []
        for family, kind in self.types.items():
            lines.append(f"# TYPE {family} {kind}")
            for name, labels, value in self.samples:
                if _family(name, self.types) == family:
                    scaled = value * n if kind in ("counter", "histogram") else value
                    lines.append(f"{name}{labels} {scaled!r}")
        return ("\n".join(lines) + "\n").encode("utf-8")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.fixture(scope="module")
def prometheus_on_real_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `prometheus` (1 s scrape and rule evaluation) scraping the captured Triton text."""
    binary = _binary("prometheus")
    assert METRICS_TEXT.is_file(), f"{METRICS_TEXT} missing (captured from the local Triton)"
    metrics = _GrowingMetrics(METRICS_TEXT.read_text(encoding="utf-8"))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = metrics.render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    exporter = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    workdir = tmp_path_factory.mktemp("prometheus")
    rules = _yaml(RULES)
    for group in rules["groups"]:
        group.pop("interval", None)  # the 1-minute baseline group too evaluates every second here
    (workdir / RULES.name).write_text(yaml.safe_dump(rules, allow_unicode=True), encoding="utf-8")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [RULES.name],
        "scrape_configs": [
            {"job_name": "triton", "static_configs": [{"targets": [f"127.0.0.1:{exporter.server_address[1]}"]}]}
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = (workdir / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        records = [r["record"] for r in _records()]
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            assert process.poll() is None, (workdir / "prometheus.log").read_text()
            try:
                if all(_query(base, name) for name in records):
                    break
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        exporter.shutdown()
        exporter.server_close()
        log.close()


def test_metrics_text_has_what_the_rules_read() -> None:
    """The captured text carries every contract series and the Triton counters the rules use."""
    samples, types = _parse_metrics_text(METRICS_TEXT.read_text(encoding="utf-8"))
    names = {name for name, _, _ in samples}
    contract = _contract()
    exported = {getattr(contract, n) for n in dir(contract) if n.startswith("METRIC_") and n != "METRIC_LABELS_KEY"}
    for name in exported:
        family = name if types.get(name) != "histogram" else None
        assert family in names or f"{name}_bucket" in names, f"{name} not in the captured Triton text"
    top = contract.METRIC_TOP_CONFIDENCE  # a histogram's series, kept as counters the stubs flush in sums
    assert {types[f"{top}_{part}"] for part in ("bucket", "sum", "count")} == {"counter"}
    les = [re.search(r'le="([^"]+)"', labels).group(1) for n, labels, _ in samples if n == f"{top}_bucket"]
    assert sorted(float(le) for le in les) == [*contract.CONFIDENCE_BUCKETS, float("inf")]
    assert names >= TRITON_METRICS - GPU_ONLY


def test_every_recording_rule_has_data_on_real_triton_metrics(prometheus_on_real_metrics: str) -> None:
    empty = [r["record"] for r in _records() if not _query(prometheus_on_real_metrics, r["record"])]
    assert not empty, f"recording rules with no data on the real Triton's metrics: {empty}"
    # and the values are the ones the text implies (the scaled counters keep every ratio)
    samples, _ = _parse_metrics_text(METRICS_TEXT.read_text(encoding="utf-8"))
    total = {n: v for n, labels, v in samples if n in ("seqcls_texts_total", "seqcls_unlabeled_texts_total")}
    (share,) = _query(prometheus_on_real_metrics, "seqcls:unlabeled_share:rate5m")
    expected = total["seqcls_unlabeled_texts_total"] / total["seqcls_texts_total"]
    assert float(share["value"][1]) == pytest.approx(expected, rel=1e-6)


def test_every_dashboard_query_has_data_on_real_triton_metrics(prometheus_on_real_metrics: str) -> None:
    model = next(
        re.search(r'model="([^"]+)"', labels).group(1)
        for name, labels, _ in _parse_metrics_text(METRICS_TEXT.read_text(encoding="utf-8"))[0]
        if name == "seqcls_texts_total"
    )
    assert model == DASHBOARD_VARIABLES["$model"], "the captured text is of another model name"
    empty = []
    for where, expr in _dashboard_queries():
        if _metric_names(expr) & GPU_ONLY or "ALERTS" in expr:
            continue  # the local Triton has no GPU; no alert fires on healthy traffic
        if not _query(prometheus_on_real_metrics, _substitute(expr)):
            empty.append(where)
    assert not empty, f"dashboard queries with no data on the real Triton's metrics: {empty}"
