"""The demo model trained once per test run and shared by the modules that need a trained classifier.

Training is the slowest thing a test can ask for (the quick demo model: 4 epochs, ~35 s on two idle
cores), so the first module that asks trains it and every later one — in this process or in another
pytest-xdist worker of the same run — gets the same directory and the same
:class:`~seqcls_tools.demo.train.TrainResult`. Callers only read it: a module that needs a changed
copy copies it first.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

_TRAINED: dict[tuple[int, int | None], Any] = {}


def run_temp_root(factory: pytest.TempPathFactory) -> Path:
    """The base temporary directory of this whole test run: under pytest-xdist each worker has its own
    (``pytest-N/popen-gwK``) inside the run's, which the workers share; without it, the process's own."""
    base = Path(factory.getbasetemp())
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def quick_demo_model(factory: pytest.TempPathFactory, *, seed: int = 0, epochs: int | None = None):
    """The quick demo model of ``seed`` (``epochs`` overrides its 4), trained epoch-bound, once per run.

    Workers take a file lock: the first trains and writes the result beside the model, the others wait
    for the lock and read it."""
    from seqcls_tools.demo.train import TrainResult, train_demo_checkpoint

    key = (seed, epochs)
    if key not in _TRAINED:
        out = run_temp_root(factory) / f"demo-quick-s{seed}-e{epochs or 'default'}"
        done = out.with_name(out.name + ".result.json")
        with open(out.with_name(out.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if training fails
            if done.is_file():
                fields = json.loads(done.read_text(encoding="utf-8"))
                _TRAINED[key] = TrainResult(**{**fields, "path": Path(fields["path"])})
            else:
                result = train_demo_checkpoint(out, seed=seed, quick=True, epochs=epochs, max_seconds=600)
                done.write_text(json.dumps({**asdict(result), "path": str(result.path)}), encoding="utf-8")
                _TRAINED[key] = result
    return _TRAINED[key]


#: The labels a "worse retrain" never predicts (their classifier bias at -30): a certain, known regression.
SWITCHED_OFF = ("组织关系##退出", "财经##亏损", "体育##受伤", "司法##判决")
DEMO_TEST = Path(__file__).resolve().parents[2] / "tools" / "seqcls_tools" / "demo" / "data" / "test.jsonl"


def worse_retrain(good: Path, out: Path) -> Path:
    """``good`` with :data:`SWITCHED_OFF` never predicted, under another fingerprint (a copy at ``out``)."""
    import shutil

    import paddle

    shutil.copytree(good, out)
    state = paddle.load(str(out / "model_state.pdparams"))
    labels = (out / "label.txt").read_text(encoding="utf-8").split()
    bias = state["classifier.bias"].numpy()
    for label in SWITCHED_OFF:
        bias[labels.index(label)] = -30.0
    state["classifier.bias"] = paddle.to_tensor(bias)
    paddle.save(state, str(out / "model_state.pdparams"))
    return out


def demo_eval_file(out: Path) -> Path:
    """The demo's held-out split as an operator's PaddleNLP ``text<TAB>label,label`` file."""
    rows = [json.loads(line) for line in DEMO_TEST.read_text(encoding="utf-8").splitlines()]
    out.write_text("".join(f"{r['text']}\t{','.join(r['labels'])}\n" for r in rows), encoding="utf-8")
    return out
