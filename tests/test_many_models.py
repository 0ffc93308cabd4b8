"""Several classifiers on one Triton: each under its own Triton names, released and rolled back alone.

One module-scoped real Triton; ``alpha`` and ``beta`` are released at the same time by two
``seqcls release`` processes, then alpha is re-released and rolled back while beta's answers,
Triton versions and MLflow aliases are watched for any change.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seqcls.config import ReleaseConfig
from seqcls.contract.names import CLASSIC, ModelName
from seqcls.errors import InputError
from seqcls.localtriton import LocalTriton
from seqcls.ops.status import status
from seqcls.release.intake import open_release
from seqcls.serving.client import TritonOps, endpoints_from_settings
from seqcls.serving.layout import TRIAL_SUFFIX, _trial_config, loaded_models
from seqcls.settings import PROJECT_ROOT, Settings
from seqcls.steps import run_release
from tests.helpers.triton import module_triton

pytestmark = [pytest.mark.slow, pytest.mark.integration]


root, triton, env = module_triton("many-models")  # one real Triton for the module


ARTIFACT = PROJECT_ROOT / "var" / "test-artifacts" / "many-models.json"


def _rss_mb(triton: LocalTriton) -> float:
    """Resident memory of tritonserver and its python backend stubs (one per model instance)."""
    import psutil

    proc = psutil.Process(triton.status().pid)
    return round(sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 1e6, 1)


def _record(**values: object) -> None:
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(ARTIFACT.read_text()) if ARTIFACT.is_file() else {}
    ARTIFACT.write_text(json.dumps({**old, **values}, indent=1))


def _ready(triton: LocalTriton) -> dict[str, list[int]]:
    import tritonclient.grpc as grpcclient

    out: dict[str, list[int]] = {}
    client = grpcclient.InferenceServerClient(url=triton.config.grpc_url)
    for m in client.get_model_repository_index(headers=triton.control_headers()).models:
        if m.state == "READY":
            out.setdefault(m.name, []).append(int(m.version))
    return {k: sorted(v) for k, v in sorted(out.items())}


def _of(ready: dict[str, list[int]], model: str) -> dict[str, list[int]]:
    return {k: v for k, v in ready.items() if k in ModelName(model).names.all}


def _answers(settings: Settings, model: str, texts: list[str]) -> list[list[str]]:
    ops = TritonOps(endpoints_from_settings(settings)[0])
    out = []
    for start in range(0, len(texts), 16):
        preds, _ = ops.infer(texts[start : start + 16], model=ModelName(model).names.ensemble)
        out += [sorted(p["label"] for p in pred) for pred in preds]
    return out


def _aliases(settings: Settings, model: str) -> dict[str, int | None]:
    from seqcls.registry.ledger import CANDIDATE, CHAMPION, PREVIOUS, alias_version

    return {a: alias_version(settings, model, a) for a in (CHAMPION, PREVIOUS, CANDIDATE)}


def _expected(settings: Settings, ckpt: Path, model: str) -> tuple[list[str], list[list[str]]]:
    from seqcls.release.records import Expected

    release = open_release(ckpt, ReleaseConfig(model_name=model), settings)
    items = Expected.load(release.workspace).items
    return [it.text for it in items], [sorted(it.labels) for it in items]


def test_names_are_per_model_and_collisions_are_refused() -> None:
    alpha = ModelName("alpha").names
    assert alpha.models == ("alpha_tokenizer", "alpha_model", "alpha_postprocess", "alpha")
    assert alpha.candidate == "alpha_candidate" and alpha.source("alpha_model") == CLASSIC.model
    assert ModelName("seqcls").names == CLASSIC and CLASSIC.tokenizer == "tokenizer"  # the classic layout, unchanged
    for bad in ("intent_model", "tokenizer", "x_candidate", "a/b", ".hidden", "alpha\n"):
        with pytest.raises(InputError):
            ReleaseConfig(model_name=bad)


def test_two_models_release_concurrently_and_roll_back_alone(
    env: dict[str, str], triton: LocalTriton, tiny_checkpoint_src: Path, tiny_checkpoint_b_src: Path
) -> None:
    rss_before = _rss_mb(triton)
    procs = {
        model: subprocess.Popen(
            [sys.executable, "-m", "seqcls.cli", "release", "--checkpoint", str(ckpt), "--model-name", model],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for model, ckpt in (("alpha", tiny_checkpoint_src), ("beta", tiny_checkpoint_b_src))
    }
    outs = {m: p.communicate(timeout=900) for m, p in procs.items()}
    failed = {m: outs[m][1][-4000:] for m, p in procs.items() if p.returncode != 0}
    assert not failed, "\n\n".join(
        [
            *(f"--- {m} stderr (tail) ---\n{tail}" for m, tail in failed.items()),
            f"--- tritonserver ---\n{triton.log_tail(40)}",
        ]
    )
    settings = Settings.from_env()
    ready = _ready(triton)
    for model in ("alpha", "beta"):
        n = ModelName(model).names
        assert _of(ready, model) == {n.tokenizer: [1], n.model: [1], n.postprocess: [1], n.ensemble: [1]}, ready
    assert not set(ready) & set(CLASSIC.all), "nothing is served under the classic names"
    _record(triton_rss_mb_nothing_loaded=rss_before, triton_rss_mb_alpha_and_beta_loaded=_rss_mb(triton))
    for model, ckpt in (("alpha", tiny_checkpoint_src), ("beta", tiny_checkpoint_b_src)):
        texts, labels = _expected(settings, ckpt, model)
        assert _answers(settings, model, texts) == labels
        assert _aliases(settings, model)["champion"] == 1

    # alpha moves on (v2 = beta's checkpoint under alpha's names), then rolls back: beta never notices
    beta_texts, beta_labels = _expected(settings, tiny_checkpoint_b_src, "beta")
    beta_before = (_of(_ready(triton), "beta"), _aliases(settings, "beta"), _answers(settings, "beta", beta_texts))
    run_release(open_release(tiny_checkpoint_b_src, ReleaseConfig(model_name="alpha"), settings))
    assert _of(_ready(triton), "alpha")["alpha"] == [2] and _aliases(settings, "alpha")["champion"] == 2
    rolled = subprocess.run(
        [sys.executable, "-m", "seqcls.cli", "rollback", "--model-name", "alpha", "--reason", "drill"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rolled.returncode == 0, rolled.stderr[-2000:]
    alpha_texts, alpha_labels = _expected(settings, tiny_checkpoint_src, "alpha")
    assert _of(_ready(triton), "alpha")["alpha"] == [1]
    assert _answers(settings, "alpha", alpha_texts) == alpha_labels
    assert _aliases(settings, "alpha")["champion"] == 1
    beta_after = (_of(_ready(triton), "beta"), _aliases(settings, "beta"), _answers(settings, "beta", beta_texts))
    assert beta_after == beta_before and beta_after[2] == beta_labels

    reports = {r.model_name: r for r in status(settings)}
    assert sorted(reports) == ["alpha", "beta"]
    assert all(r.agree for r in reports.values()), [line for r in reports.values() for line in r.lines()]
    shown = subprocess.run(
        [sys.executable, "-m", "seqcls.cli", "status", "--json"], env=env, capture_output=True, text=True, timeout=300
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert sorted(m["model_name"] for m in json.loads(shown.stdout)) == ["alpha", "beta"]


def test_same_checkpoint_with_another_threshold_is_another_registry_version(
    env: dict[str, str], triton: LocalTriton, tiny_checkpoint_src: Path
) -> None:
    from seqcls.registry.ledger import client

    settings = Settings.from_env()
    runs = [
        run_release(open_release(tiny_checkpoint_src, ReleaseConfig(model_name="gamma", threshold=t), settings))
        for t in (0.5, 0.7, 0.7)
    ]
    serving = [round(sum(r.seconds for r in run if r.step in ("reload", "smoke", "expose")), 2) for run in runs]
    _record(one_replica_serving_steps_s=serving[:2])
    versions = sorted(client(settings).search_model_versions("name = 'gamma'"), key=lambda v: int(v.version))
    assert [int(v.version) for v in versions] == [1, 2], "0.7 is a new version; its re-run reuses it"
    served = [json.loads(v.tags["serving_config"])["thresholds"] for v in versions]
    assert set(served[0].values()) == {0.5} and set(served[1].values()) == {0.7}
    assert _aliases(settings, "gamma")["champion"] == 2
    assert _of(_ready(triton), "gamma")["gamma"] == [2]
    report = status(settings, ["gamma"])[0]
    assert report.agree and report.registry["expected"] == 2, report.lines()


def _readme_curl() -> str:
    """The KServe-v2 curl command the manual shows (docs/serving-contract.md), exactly (the test only points it
    at its own port)."""
    text = (PROJECT_ROOT / "docs" / "serving-contract.md").read_text(encoding="utf-8")
    block = text.split("```bash\ncurl -s -X POST http://127.0.0.1:8000/v2/models/seqcls/infer", 1)[1].split("```", 1)[0]
    return "curl -s -X POST http://127.0.0.1:8000/v2/models/seqcls/infer" + block.rstrip()


def test_the_readme_curl_call_answers_what_grpc_answers(
    env: dict[str, str], triton: LocalTriton, tiny_checkpoint_src: Path
) -> None:
    """The default model beside the others, called as its users call it: KServe-v2 HTTP/JSON."""
    settings = Settings.from_env()
    results = {r.step: r for r in run_release(open_release(tiny_checkpoint_src, settings=settings))}
    from seqcls.serving.repository import Repository

    # Triton's own metrics count exactly the smoke test's requests on the candidate route
    counted = results["smoke"].summary["triton_metrics"][triton.config.grpc_url]
    sent = 65 + -(-65 // 8)  # the golden texts one by one, then in batches of 8
    assert counted == {
        "nv_inference_request_success": sent,
        "nv_inference_request_failure": 0,
        "nv_inference_count": 2 * 65,
    }, counted

    assert (
        Repository.from_settings(settings, ModelName("seqcls")).release_info(1)["max_text_bytes"] == 65536
    )  # served limit
    command = _readme_curl().replace("127.0.0.1:8000", triton.config.http_url)
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    outputs = {o["name"]: o for o in answer["outputs"]}
    text = json.loads(command.split("-d '", 1)[1].rsplit("'", 1)[0])["inputs"][0]["data"][0]
    preds, probs = TritonOps(endpoints_from_settings(settings)[0]).infer([text])
    assert answer["model_name"] == "seqcls" and outputs["predictions"]["shape"] == [1, 1]
    assert json.loads(outputs["predictions"]["data"][0]) == preds[0]
    assert outputs["probabilities"]["data"] == pytest.approx([float(p) for p in probs[0]], abs=1e-6)


def test_layout_calibration_times_throwaway_copies_that_no_client_reaches(
    env: dict[str, str], triton: LocalTriton, tiny_checkpoint_b_src: Path
) -> None:
    settings = Settings.from_env()
    if _aliases(settings, "beta")["champion"] is None:  # run alone: release beta first
        run_release(open_release(tiny_checkpoint_b_src, ReleaseConfig(model_name="beta"), settings))
    repo = Path(env["SEQCLS_TRITON_REPOSITORY"])
    files_before = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if "__pycache__" not in p.parts)
    served_before = _of(_ready(triton), "beta")
    texts, labels = _expected(settings, tiny_checkpoint_b_src, "beta")
    ops = TritonOps(endpoints_from_settings(settings)[0])
    vdir, stale = repo / "beta_model" / "1", f"beta_model{TRIAL_SUFFIX}3x1"
    ops.client.load_model(  # a trial as a killed calibration leaves it
        stale,
        config=_trial_config((vdir / "config.snapshot.pbtxt").read_text(encoding="utf-8"), stale, "3x1"),
        files={f"file:1/{f.name}": f.read_bytes() for f in vdir.iterdir() if f.is_file()},
    )
    assert stale in loaded_models(ops) and stale not in _ready(triton)  # override loads are not in the index
    groups = ops.client.get_model_config(stale, as_json=True)["config"]["instance_group"]
    assert [g["count"] for g in groups] == [3], groups  # the trial's layout is what Triton runs
    cmd = [sys.executable, "-m", "seqcls.cli", "calibrate-layout", "--model-name", "beta", "--cores", "2"]
    shown = subprocess.run([*cmd, "--seconds", "1", "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    cal = json.loads(shown.stdout)
    assert [t["layout"] for t in cal["trials"]] == ["1x2", "2x1"] and cal["version"] == 1
    assert all(t["requests"] > 0 and t["failed"] == 0 for t in cal["trials"]), cal["trials"]
    assert cal["chosen"] in ("1x2", "2x1") and cal["setting"] == f"SEQCLS_SERVING_LAYOUT={cal['chosen']}"
    ready = _ready(triton)
    assert not [m for m in loaded_models(ops) if ".layout-" in m]  # the throwaway models (and the stale one) are gone
    assert _of(ready, "beta") == served_before and _answers(settings, "beta", texts) == labels
    files_after = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if "__pycache__" not in p.parts)
    assert files_after == files_before, "calibration wrote into the model repository"
    bad = subprocess.run([*cmd, "--layouts", "1x2,2by1"], env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "layout '2by1'" in bad.stderr, bad.stderr[-1000:]
