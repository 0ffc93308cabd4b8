"""The Kubernetes Triton pod gates its readiness on ``seqcls replica-ready`` (checked offline, like
``tests/test_kubernetes.py``: no cluster here). The command the probe runs must parse with seqcls's own
parser, reach this pod's Triton and read the repository Triton serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from seqcls.cli import build_parser
from seqcls.settings import ENV_TRITON_CONTROL_KEY, ENV_TRITON_REPOSITORY

ROOT = Path(__file__).resolve().parents[1]
TRITON_YAML = ROOT / "deploy" / "kubernetes" / "triton.yaml"


def _pod() -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(TRITON_YAML.read_text(encoding="utf-8")) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]


def _gate(pod: dict[str, Any]) -> dict[str, Any]:
    def runs(c: dict[str, Any]) -> list[str]:
        return c.get("startupProbe", {}).get("exec", {}).get("command") or []

    gates = [c for c in pod["containers"] if "replica-ready" in runs(c)]
    assert len(gates) == 1, "no container gates the pod on `seqcls replica-ready`"
    return gates[0]


def test_the_pod_is_gated_on_its_own_triton_serving_the_recorded_state() -> None:
    pod = _pod()
    gate = _gate(pod)
    probe = gate["startupProbe"]
    command = probe["exec"]["command"]
    assert command[0] == "seqcls"
    args = build_parser().parse_args(command[1:])  # what the image's seqcls accepts
    assert args.reconcile, "a new replica must be made to serve the recorded state, not only judged"
    (triton,) = [c for c in pod["containers"] if c["name"] == "tritonserver"]
    grpc = {p["name"]: p["containerPort"] for p in triton["ports"]}["grpc"]
    assert args.url == f"localhost:{grpc}", "the probe must check this pod's own Triton"
    assert args.timeout < probe["timeoutSeconds"], "the check must answer before the kubelet gives up on it"
    assert probe["failureThreshold"] * probe["periodSeconds"] >= 600, "give Triton and the loads 10 min"


def test_the_gate_reads_the_repository_triton_serves_and_holds_the_control_key() -> None:
    pod = _pod()
    gate = _gate(pod)
    (triton,) = [c for c in pod["containers"] if c["name"] == "tritonserver"]
    triton_mount = next(m for m in triton["volumeMounts"] if m["name"] == "model-repository")
    gate_mount = next(m for m in gate["volumeMounts"] if m["name"] == "model-repository")
    env = {e["name"]: e for e in gate["env"]}
    assert env[ENV_TRITON_REPOSITORY]["value"] == gate_mount["mountPath"] == triton_mount["mountPath"]
    assert triton_mount.get("readOnly"), "Triton itself never writes the repository"
    assert not gate_mount.get("readOnly"), "--reconcile takes the repository lock and may rewrite config.pbtxt"
    key = env[ENV_TRITON_CONTROL_KEY]["valueFrom"]["secretKeyRef"]
    triton_key = {e["name"]: e for e in triton["env"]}[ENV_TRITON_CONTROL_KEY]["valueFrom"]["secretKeyRef"]
    assert key == triton_key, "reconcile loads models: it needs the key Triton was started with"
