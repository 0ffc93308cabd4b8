"""The benchmark's ``classic`` profile really serves PaddleNLP's tokenizer.

Regression guard: ``publish._files_for`` once ignored ``ServingOptions.tokenizer_impl``, so
``model_repository/tokenizer/model_paddlenlp.py`` was never shipped and the "classic" baseline
(the one every benchmark ratio is divided by) silently ran the fast tokenizer. Only the option's
label was tested. Here the published files are compared byte for byte with their sources; no
Triton is needed to publish.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqcls.contract.names import TOKENIZER
from seqcls.release.intake import open_release
from seqcls.serving.repository import RELEASE_FILE, ServingOptions
from seqcls.settings import Settings
from seqcls.steps import run_release
from seqcls.steps.publish import publish

pytestmark = pytest.mark.slow

SOURCE = Path(__file__).resolve().parents[1] / "model_repository"


def _version_dir(repo: Path, version: int) -> Path:
    return repo / TOKENIZER / str(version)


def test_classic_ships_the_paddlenlp_tokenizer_and_the_default_the_fast_one(
    tiny_checkpoint: Path, home: Path, tmp_path: Path
) -> None:
    classic_src = (SOURCE / TOKENIZER / "model_paddlenlp.py").read_bytes()
    fast_src = (SOURCE / TOKENIZER / "model.py").read_bytes()
    contract_src = (SOURCE / "common" / "seqcls_contract.py").read_bytes()
    assert classic_src != fast_src, "the two tokenizer sources are identical: this test could not tell them apart"

    repo = tmp_path / "triton-repo"
    settings = Settings(home=home, triton_repository=repo, model_repository_source=SOURCE)
    release = open_release(tiny_checkpoint, settings=settings)
    run_release(release, until="evaluate")

    classic = publish(release, ServingOptions(tokenizer_impl="paddlenlp"))
    version = classic.summary["version"]
    vdir = _version_dir(repo, version)
    assert (vdir / "model.py").read_bytes() == classic_src, "classic must serve tokenizer/model_paddlenlp.py"
    assert (vdir / "seqcls_contract.py").read_bytes() == contract_src
    assert (vdir / "tokenizer_config.json").is_file()  # PaddleNLP's tokenizer loads it
    info = json.loads((vdir / RELEASE_FILE).read_text(encoding="utf-8"))
    assert info["serving"]["tokenizer_impl"] == "paddlenlp"

    default = publish(release, ServingOptions())
    assert default.summary["version"] != version, "a different serving form must be a new version"
    vdir = _version_dir(repo, default.summary["version"])
    assert (vdir / "model.py").read_bytes() == fast_src, "the default (hf) must serve tokenizer/model.py"
    assert (vdir / "seqcls_contract.py").read_bytes() == contract_src
    assert not (vdir / "tokenizer_config.json").exists()
    assert json.loads((vdir / RELEASE_FILE).read_text(encoding="utf-8"))["serving"]["tokenizer_impl"] == "hf"
