"""The quality gate's eval set in Airflow: the models file's key, and confinement under the model's root."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from seqcls.airflow.context import confined_eval_set
from seqcls.airflow.models_file import load_models
from seqcls.config import ReleaseConfig
from seqcls.errors import InputError
from seqcls.settings import Settings


def _models(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "seqcls-models.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_models_file_eval_set_becomes_the_param_default(tmp_path: Path) -> None:
    (spec,) = load_models(_models(tmp_path, "models:\n  - name: alpha\n    eval_set: eval/alpha-test.txt\n"))
    assert spec.params["eval_set"] == "eval/alpha-test.txt"


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("    eval_set: ../other/test.txt\n", "'..' is not allowed"),
        ("    eval_set: 3\n", "expected a file path"),
        ("    eval_set: a.txt\n    params: {eval_set: b.txt}\n", "given twice"),
    ],
)
def test_a_bad_eval_set_key_names_the_file_model_and_key(tmp_path: Path, entry: str, expected: str) -> None:
    path = _models(tmp_path, "models:\n  - name: alpha\n" + entry)
    with pytest.raises(InputError, match=expected) as err:
        load_models(path)
    assert str(path) in str(err.value) and "model 'alpha': eval_set" in str(err.value)


def test_a_run_reads_eval_sets_only_under_its_models_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "eval").mkdir(parents=True)
    outside.mkdir()
    (root / "eval" / "test.txt").write_text("text\tlabel\n", encoding="utf-8")
    (outside / "test.txt").write_text("text\tlabel\n", encoding="utf-8")
    (root / "eval" / "link.txt").symlink_to(outside / "test.txt")
    settings = replace(Settings.from_env(home=tmp_path / "home"), checkpoints_root=root)

    relative = confined_eval_set(ReleaseConfig(eval_set="eval/test.txt"), settings)
    assert relative.eval_set == str((root / "eval" / "test.txt").resolve())
    assert confined_eval_set(ReleaseConfig(), settings).eval_set is None
    for given in (str(outside / "test.txt"), "eval/link.txt", "../outside/test.txt"):
        with pytest.raises(InputError, match="outside this model's checkpoints root") as err:
            confined_eval_set(ReleaseConfig(eval_set=given), settings)
        assert repr(given) in str(err.value)
