"""Per-text execution vs the other ``seqcls_model`` batchings, in-process, on a real converted ERNIE.

The shipped ``model_repository/seqcls_model/model.py`` is loaded from a version directory (as
publish lays it out) with a stand-in for ``triton_python_backend_utils`` and its ``execute`` is
called directly — no Triton, no tokenizer stub, no gRPC: only what the batching strategy changes.
Three request shapes, texts from the bench corpus tokenized by the served tokenizer (``longest``
padding, ``max_length`` 128):

- ``1x1``: one request of one text per ``execute`` (single-text clients, no dynamic batching);
- ``1x8``: one request of eight texts per ``execute`` (padded to that request's longest);
- ``8x1``: eight single-text requests in one ``execute`` (what the dynamic batcher hands over);
- ``1x8=``: one request of eight texts of one token length (no padding at all: where grouping
  equal lengths into one run can pay, vs ``per-text/ungrouped``, strictly one run per text).

Prints sentences/s per strategy and shape (each call's best of the rounds, strategies interleaved
call by call), the ratio
``1x8 / 1x1`` per strategy, and max |Δ| of every strategy's logits vs ``per-request`` on the
8-text requests (each padded to its longest) against the parity gate's tolerance; exit 1 if any
is outside it. Every figure comes from this one run. ::

    .venv/bin/python -m seqcls_tools.bench.per_text            # ERNIE 3.0 medium shape (~1 min to build)
    .venv/bin/python -m seqcls_tools.bench.per_text --spec tiny --texts 64 --rounds 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from seqcls_tools.fake_pb_utils import Tensor, fake_pb_utils, request

SAME = "1x8="
SHAPES = ("1x1", "1x8", "8x1", SAME)
#: the contract's strategies plus per-text strictly one ORT run per row (``group_equal_lengths`` off)
UNGROUPED = "per-text/ungrouped"


def logits_of(response: Any) -> np.ndarray:
    if response.error is not None:
        raise RuntimeError(response.error.message())
    return response.outputs["logits"]


# --- the model --------------------------------------------------------------------------------------


def to_onnx(checkpoint: Path, out: Path) -> Path:
    """A PaddleNLP checkpoint → ``out/model.onnx`` the way export + convert do it (PIR, paddle2onnx)."""
    import paddle
    from paddlenlp.transformers import ErnieForSequenceClassification

    from seqcls.frameworks.paddle import static_model_files
    from seqcls.steps.convert import INPUT_NAMES, convert_static

    out.mkdir(parents=True, exist_ok=True)
    onnx_file = out / "model.onnx"
    if onnx_file.is_file() and onnx_file.stat().st_size:
        return onnx_file
    paddle.set_device("cpu")
    model = ErnieForSequenceClassification.from_pretrained(str(checkpoint))
    model.eval()
    spec = [paddle.static.InputSpec(shape=[None, None], dtype="int64", name=n) for n in INPUT_NAMES]
    static_dir = out / "static"
    paddle.jit.save(paddle.jit.to_static(model, full_graph=True, input_spec=spec), str(static_dir / "float32"))
    model_file, params_file = static_model_files(static_dir)
    labels = model.config.num_labels
    convert_static(model_file, params_file, onnx_file, opset=14, num_labels=labels)
    shutil.rmtree(static_dir, ignore_errors=True)
    return onnx_file


def load_model(onnx_file: Path, root: Path, *, batching: str, threads: int = 2, pad_id: int = 0, **release: Any):
    """An initialized ``seqcls_model`` TritonPythonModel over ``onnx_file`` (linked into a fresh version dir).

    Call with the fake ``triton_python_backend_utils`` already in ``sys.modules``.
    """
    from seqcls.settings import PROJECT_ROOT

    source = PROJECT_ROOT / "model_repository"
    version = Path(tempfile.mkdtemp(prefix=f"{batching.replace('/', '-')}-", dir=root)) / "1"
    version.mkdir()
    shutil.copy(source / "seqcls_model" / "model.py", version / "model.py")
    for common in ("seqcls_contract", "seqcls_backend"):
        shutil.copy(source / "common" / f"{common}.py", version / f"{common}.py")
    os.symlink(Path(onnx_file).resolve(), version / "model.onnx")
    (version / "release.json").write_text(json.dumps({"pad_id": pad_id, **release}), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"_seqcls_model_{version.parent.name}", version / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    params = {"batching": batching, "intra_op_threads": str(threads), "pad_id": str(pad_id)}
    config = json.dumps({"parameters": {k: {"string_value": v} for k, v in params.items()}})
    model.initialize({"model_config": config, "model_repository": str(version.parent), "model_version": "1"})
    return model


# --- the measurement --------------------------------------------------------------------------------


def _batches(ids: list[list[int]], shape: str, text_mod: ModuleType) -> list[list[dict[str, Tensor]]]:
    """The ``execute`` calls of one shape: each a list of requests, each request padded to its longest."""

    def req(rows: list[list[int]]) -> dict[str, Tensor]:
        a, t = text_mod.pad(rows, strategy="longest")
        return request(input_ids=a, token_type_ids=t)

    if shape == "1x1":
        return [[req([x])] for x in ids]
    if shape in ("1x8", SAME):
        return [[req(ids[i : i + 8])] for i in range(0, len(ids), 8)]
    return [[req([x]) for x in ids[i : i + 8]] for i in range(0, len(ids), 8)]


def same_length(ids: list[list[int]], texts: int) -> list[list[int]]:
    """``texts`` tokenized texts in runs of eight of one length (the ``1x8=`` shape), lengths spread out."""
    by_len: dict[int, list[list[int]]] = {}
    for x in ids:
        by_len.setdefault(len(x), []).append(x)
    full = [v[:8] for _, v in sorted(by_len.items()) if len(v) >= 8]
    step = max(1, len(full) // max(1, texts // 8))
    return [x for group in full[::step][: texts // 8] for x in group]


def _time(model: Any, call: list[dict[str, Tensor]]) -> tuple[float, list[np.ndarray]]:
    t0 = time.perf_counter()
    out = [logits_of(r) for r in model.execute(call)]
    return time.perf_counter() - t0, out


def measure(
    onnx_file: Path, ids: list[list[int]], same: list[list[int]], *, rounds: int, threads: int, work: Path
) -> dict[str, Any]:
    """sentences/s per (strategy, shape) and every strategy's logits.

    Interleaved finely so that a busy machine slows every strategy alike: each ``execute`` call runs
    under every strategy back to back (in a rotating order), and a call's time is its fastest of
    ``rounds``; a shape's rate is its texts over the sum of its calls' times."""
    from seqcls.contract import shipped

    text_mod = shipped.text()
    strategies = [*shipped.contract().BATCHINGS, UNGROUPED]
    sys.modules["triton_python_backend_utils"] = fake_pb_utils()
    # one model, one ORT session: separate sessions' intra-op threads would spin against each other
    model = load_model(onnx_file, work, batching="per-request", threads=threads)

    def run(strategy: str, call: list[dict[str, Tensor]]) -> tuple[float, list[np.ndarray]]:
        model.batching, model.group_equal_lengths = strategy.split("/")[0], strategy != UNGROUPED
        return _time(model, call)

    calls = {shape: _batches(same if shape == SAME else ids, shape, text_mod) for shape in SHAPES}
    texts = {shape: len(same if shape == SAME else ids) for shape in SHAPES}
    for s in strategies:  # warm-up: ORT's first runs at a new shape allocate
        for shape in SHAPES:
            for call in calls[shape][:2]:
                run(s, call)
    best = {s: {shape: [np.inf] * len(calls[shape]) for shape in SHAPES} for s in strategies}
    outs: dict[str, dict[str, list[np.ndarray]]] = {s: {shape: [] for shape in SHAPES} for s in strategies}
    for k in range(rounds):
        for shape in SHAPES:
            for j, call in enumerate(calls[shape]):
                shift = (j + k) % len(strategies)
                for s in strategies[shift:] + strategies[:shift]:
                    seconds, out = run(s, call)
                    best[s][shape][j] = min(best[s][shape][j], seconds)
                    if k == 0:
                        outs[s][shape] += out
    logits = {s: {shape: np.concatenate(outs[s][shape]) for shape in SHAPES} for s in strategies}
    best = {s: {shape: float(np.sum(best[s][shape])) for shape in SHAPES} for s in strategies}
    rates = {s: {shape: texts[shape] / best[s][shape] for shape in SHAPES} for s in strategies}
    reference = {shape: logits["per-request"][SAME if shape == SAME else "1x8"] for shape in SHAPES}
    return {"rates": rates, "logits": logits, "reference": reference, "texts": texts}


def _ids(corpus: list[str], vocab_file: Path, max_length: int = 128) -> list[list[int]]:
    from seqcls.contract import shipped

    text_mod = shipped.text()
    tok = text_mod.build_tokenizer(vocab_file, lowercase=True, max_length=max_length)
    return text_mod.encode(tok, corpus)


def main(argv: list[str] | None = None) -> int:
    from seqcls.config import ReleaseConfig
    from seqcls_tools.bench.corpus import make_corpus, make_labels
    from seqcls_tools.bench.model import MEDIUM, TINY, build_checkpoint

    p = argparse.ArgumentParser(prog="python -m seqcls_tools.bench.per_text", description=__doc__.split("\n")[0])
    p.add_argument("--spec", choices=("medium", "tiny"), default="medium", help="model shape (default medium)")
    p.add_argument("--texts", type=int, default=64, help="texts per measurement, a multiple of 8 (default 64)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; the best of each is kept (default 3)")
    p.add_argument("--threads", type=int, default=2, help="ORT intra-op threads (serving default 2)")
    p.add_argument("--work", type=Path, help="keep the checkpoint and ONNX here (reused when present)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    spec = MEDIUM if args.spec == "medium" else TINY
    work = args.work or Path(tempfile.mkdtemp(prefix="seqcls-per-text-"))
    work.mkdir(parents=True, exist_ok=True)
    texts = max(8, args.texts // 8 * 8)
    corpus = make_corpus(2000, seed=0)
    checkpoint = work / f"checkpoint-{spec.name}"
    t0 = time.perf_counter()
    if not (checkpoint / "bench_model.json").is_file():
        build_checkpoint(checkpoint, spec, corpus, make_labels(spec.num_labels), golden=corpus[-32:], seed=0)
    onnx_file = to_onnx(checkpoint, work / f"onnx-{spec.name}")
    built = time.perf_counter() - t0
    pool = _ids(corpus[64:], checkpoint / "vocab.txt")  # not the calibration texts
    ids, same = pool[936 : 936 + texts], same_length(pool, texts)
    runs = work / "versions"
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir()
    result = measure(onnx_file, ids, same, rounds=args.rounds, threads=args.threads, work=runs)
    gate = ReleaseConfig()
    lengths = [len(x) for x in ids]
    print(
        f"model {spec.name} ({onnx_file}, ready in {built:.0f} s); {texts} texts, tokens mean "
        f"{np.mean(lengths):.1f} max {max(lengths)} ({SAME}: {len(same)} texts, {len(same) // 8} lengths "
        f"{min(map(len, same))}-{max(map(len, same))}); {args.threads} intra-op threads; "
        f"best of {args.rounds} rounds per call; "
        f"loadavg {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(f"{'strategy':<20}" + "".join(f"{x + ' sent/s':>14}" for x in SHAPES) + f"{'1x8/1x1':>9}{'max|Δ|':>10}")
    summary: dict[str, Any] = {"spec": spec.to_dict(), "texts": result["texts"], "threads": args.threads}
    summary["strategies"] = {}
    for s, rates in result["rates"].items():
        diffs = [np.abs(result["logits"][s][x] - result["reference"][x]) for x in SHAPES]
        delta = max(float(d.max()) for d in diffs)
        within = all(
            np.allclose(result["logits"][s][x], result["reference"][x], atol=gate.atol, rtol=gate.rtol) for x in SHAPES
        )
        ratio = rates["1x8"] / rates["1x1"]
        print(f"{s:<20}" + "".join(f"{rates[x]:>14.1f}" for x in SHAPES) + f"{ratio:>9.2f}{delta:>10.1e}")
        summary["strategies"][s] = {f"{x}_sentences_per_s": round(rates[x], 2) for x in SHAPES}
        summary["strategies"][s].update(ratio_1x8_vs_1x1=round(ratio, 3), max_abs_diff=delta, within_gate=within)
    base, pt, ung = (result["rates"][s] for s in ("per-request", "per-text", UNGROUPED))
    print(
        "per-text / per-request: "
        + ", ".join(f"{x} {pt[x] / base[x]:.2f}x" for x in SHAPES)
        + f"; grouping equal lengths ({SAME}): {pt[SAME] / ung[SAME]:.2f}x vs one run per text"
    )
    print(
        f"max|Δ| vs per-request with 8-text requests padded to their longest; parity gate atol {gate.atol} "
        f"rtol {gate.rtol}: "
        + ", ".join(f"{s} {'ok' if v['within_gate'] else 'FAIL'}" for s, v in summary["strategies"].items())
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(v["within_gate"] for v in summary["strategies"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
