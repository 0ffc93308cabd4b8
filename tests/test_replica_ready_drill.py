"""``seqcls replica-ready`` through a real local Triton: a replica that lost what it loaded (a restart in
explicit mode, stale configs) is NOT ready until reconciled; ``--reconcile`` makes it ready and it then
answers with the recorded version; a model whose served file is broken is reported while another model is
still checked (and made ready). The shared drill Triton stands in for "a fresh replica" by unloading
everything — the state on disk is what the fleet serves, the server holds none of it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from seqcls.contract.names import ModelName
from seqcls.serving.client import Endpoint, TritonOps, endpoints_from_settings
from seqcls.serving.state import state_path
from tests.helpers.drills import PROBE_TEXTS, Drill, drill_test, served_answers, unload_all
from tests.helpers.triton import start_triton

NAME, OTHER = ModelName("seqcls"), ModelName("zulu")  # zulu: checked after the broken one


def _probe(d: Drill, *args: str, url: str | None = None) -> tuple[int, dict, float]:
    """The probe as a kubelet runs it (a fresh process): exit code, its JSON, wall seconds."""
    t0 = time.perf_counter()
    out = d.cli("replica-ready", "--url", url or d.server.config.grpc_url, "--json", *args, timeout=120)
    seconds = time.perf_counter() - t0
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return out.returncode, json.loads(out.stdout), seconds


@drill_test
def test_a_replica_is_not_ready_until_it_serves_the_recorded_version(drill: Drill, tiny_checkpoint_src: Path) -> None:
    d = drill
    d.release(tiny_checkpoint_src)
    code, ready, seconds = _probe(d)
    assert code == 0 and ready["ready"], ready
    print(f"probe on a converged replica: {seconds:.2f}s wall (check {ready['seconds']:.2f}s)")
    recorded = state_path(d.repo, NAME).read_bytes()

    unload_all(d.server)  # a restarted replica: the repository says v1, the server holds nothing
    code, fresh, _ = _probe(d)
    assert code == 1 and not fresh["ready"], fresh
    (model,) = fresh["models"]
    assert model["model_name"] == NAME and model["serving"] == 1
    assert f"{NAME.names.ensemble} v1 not READY" in " ".join(model["missing"]), model
    assert "--reconcile" in model["fix"]

    code, fixed, seconds = _probe(d, "--reconcile")
    assert code == 0 and fixed["ready"], fixed
    print(f"probe with --reconcile on an empty replica: {seconds:.2f}s wall (check {fixed['seconds']:.2f}s)")
    op = TritonOps(endpoints_from_settings(d.settings)[0])
    assert op.ready(NAME.names.ensemble, 1)
    preds, _ = op.infer(["answers with the recorded version"], model=NAME.names.ensemble, version=1)
    assert len(preds) == 1
    assert state_path(d.repo, NAME).read_bytes() == recorded  # a probe never writes the recorded state
    d.assert_invariant(served=1)


@drill_test
def test_a_broken_model_is_reported_while_another_is_still_made_ready(
    drill: Drill, tiny_checkpoint_src: Path, tiny_checkpoint_b_src: Path
) -> None:
    d = drill
    d.release(tiny_checkpoint_src)
    d.release(tiny_checkpoint_b_src, model_name=OTHER)
    unload_all(d.server)
    graph = d.repo / NAME.names.model / "1" / "model.onnx"
    graph.unlink()  # a new file, not the hard-linked one: the shared workspaces keep theirs
    graph.write_bytes(b"not an onnx graph")

    code, result, _ = _probe(d, "--reconcile")
    assert code == 1, result
    by_name = {m["model_name"]: m for m in result["models"]}
    assert [m["model_name"] for m in result["models"]] == [NAME, OTHER]  # the broken one first
    print("\n".join(f"{m['model_name']}: {m['missing']} {m['fix']}" for m in result["models"]))
    assert not by_name[NAME]["ready"] and by_name[OTHER]["ready"], result
    broken = " ".join(by_name[NAME]["missing"])
    assert NAME.names.model in broken and "model.onnx" in broken, broken  # the Triton model, the file
    assert all("\n" not in m for m in by_name[NAME]["missing"])  # one line per model, tracebacks folded
    assert "seqcls status --model-name seqcls" in by_name[NAME]["fix"]
    op = TritonOps(endpoints_from_settings(d.settings)[0])
    preds, _ = op.infer(["the other model answers"], model=OTHER.names.ensemble, version=1)
    assert len(preds) == 1


@drill_test
def test_a_replica_started_after_a_release_answers_with_the_recorded_version_once_ready(
    drill: Drill, tiny_checkpoint_src: Path, tmp_path: Path
) -> None:
    """A second real Triton on the same repository, started after the release (explicit mode: it loads
    nothing by itself) — a new pod. Reconciling it leaves the first replica as it was."""
    d = drill
    d.release(tiny_checkpoint_src)
    served = served_answers(d, NAME)
    second = start_triton(tmp_path, "second", repository=d.repo)
    try:
        url = second.config.grpc_url
        code, fresh, _ = _probe(d, url=url)
        assert code == 1 and not fresh["ready"], fresh
        code, fixed, seconds = _probe(d, "--reconcile", url=url)
        assert code == 0 and fixed["ready"], fixed
        print(f"--reconcile of a replica started after the release: {seconds:.2f}s wall")
        preds, probs = TritonOps(Endpoint(url)).infer(PROBE_TEXTS, model=NAME.names.ensemble, version=1)
        assert [preds, [[round(float(p), 5) for p in row] for row in probs]] == served  # what the fleet serves
        code, first, _ = _probe(d)
        assert code == 0 and first["ready"], first  # the first replica untouched and still ready
    finally:
        second.stop()
    d.assert_invariant(served=1)
