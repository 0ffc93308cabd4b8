"""Fast hot reloads (issue 16): what made a reload start each python stub twice, and its guards.

- the tokenizer's character classes, computed once at publish and shipped in the version, equal
  the computed ones exactly (and are ignored when the interpreter's Unicode tables differ);
- the composing models of one endpoint load at the same time (reconcile's thread pool);
- on a real Triton, a published version never changes after its stubs start (no ``__pycache__``
  written into it), so the candidate route's ensemble load does not reload its composing models:
  each composing model's new version is loaded exactly once per release.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from seqcls.contract import shipped
from seqcls.contract.names import COMPOSING, ModelName

TRICKY = [
    "",
    "球队在决赛中夺冠！",
    "Café déjà vu — naïve façade",
    "emoji 😀👍🏽 and ¥€© symbols ½ ² º",
    "ctrl\x00\x07char\u200b\ufeffs\u00ad and \u3000 ideographic space\tTab\nNL",
    "a" * 120 + " unbrokenwordoveronehundredcharacters",
    "U+FFFD \ufffd, private \ue000, unassigned \U000e01f0, Mn \u0301 alone",
]


def test_shipped_char_classes_equal_the_computed_ones(tmp_path: Path) -> None:
    text = shipped.text()
    path = text.write_char_classes(tmp_path / text.CHAR_CLASSES_FILE)
    assert text.read_char_classes(path) == text.paddlenlp_char_classes()
    vocab = tmp_path / "vocab.txt"
    words = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]", *"球队在决赛中夺冠cafedejavu", "emoji", "and", "##s"]
    vocab.write_text("\n".join(words) + "\n", encoding="utf-8")
    computed = text.build_tokenizer(vocab, max_length=64)
    shipped_tok = text.build_tokenizer(vocab, max_length=64, classes=text.read_char_classes(path))
    assert text.encode(shipped_tok, TRICKY) == text.encode(computed, TRICKY)


def test_a_table_from_other_unicode_tables_or_damaged_is_not_used(tmp_path: Path) -> None:
    text = shipped.text()
    path = text.write_char_classes(tmp_path / "t.json")
    table = json.loads(path.read_text(encoding="utf-8"))
    for edit in (
        lambda t: t.update(unicode="13.0.0"),
        lambda t: t.update(extra=[0x00AD]),
        lambda t: t["classes"].pop("mark"),
        lambda t: t["classes"].update(split="oops"),
    ):
        bad = json.loads(json.dumps(table))
        edit(bad)
        (tmp_path / "bad.json").write_text(json.dumps(bad), encoding="utf-8")
        assert text.read_char_classes(tmp_path / "bad.json") is None
    (tmp_path / "junk.json").write_text("{not json", encoding="utf-8")
    assert text.read_char_classes(tmp_path / "junk.json") is None
    assert text.read_char_classes(tmp_path / "missing.json") is None


class _SlowOps:
    """A fake endpoint whose loads take 0.3 s each and record how many run at once."""

    def __init__(self, names) -> None:
        self.endpoint = SimpleNamespace(grpc="fake:1")
        self.request_timeout = 1.0
        self.names, self.running, self.peak, self._lock = names, 0, 0, threading.Lock()

    def require_live(self) -> None:
        pass

    def repository_index(self, timeout: float | None = None) -> list[dict]:
        return []

    def load(self, model: str) -> None:
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(0.3)
        with self._lock:
            self.running -= 1

    def verify_ready(self, model: str, versions) -> None:
        pass


def test_composing_models_load_at_the_same_time() -> None:
    from seqcls.serving.reconcile import _Reconciler

    names = ModelName("seqcls").names
    ops = _SlowOps(names)
    rec = _Reconciler(SimpleNamespace(names=names), [ops], {m: [1] for m in names.all})
    t0 = time.perf_counter()
    rec.apply_all([ops], names.composing, {m: [1] for m in names.composing})
    assert ops.peak == len(names.composing) == 3
    assert time.perf_counter() - t0 < 0.3 * 2, "the three loads ran one after another"
    assert not rec.report.errors and len(rec.report.actions) == 3


@pytest.mark.slow
@pytest.mark.integration
def test_a_release_loads_each_composing_version_once(server, tiny_checkpoint: Path, tiny_checkpoint_b: Path, home):
    from seqcls.release.intake import open_release
    from seqcls.serving.repository import Repository
    from seqcls.steps import run_release
    from tests.helpers.triton import settings_for

    settings = settings_for(server, home)
    run_release(open_release(tiny_checkpoint, settings=settings))
    run_release(open_release(tiny_checkpoint_b, settings=settings))
    repo = Repository.from_settings(settings, ModelName("seqcls"))
    text = shipped.text()
    for model in COMPOSING:
        for version in (1, 2):
            vdir = repo.root / model / str(version)
            assert not (vdir / "__pycache__").is_dir(), f"{vdir}: the stub wrote bytecode into a published version"
        assert not repo.damaged_files(2)
    assert text.read_char_classes(repo.root / "tokenizer" / "2" / text.CHAR_CLASSES_FILE) is not None
    log = server.log_path.read_text(encoding="utf-8", errors="replace")
    for model in COMPOSING:
        # once by reload's widen; before, the candidate ensemble's load re-polled the composing models,
        # found the bytecode their stubs had written, and started every one of them again
        assert log.count(f'"loading: {model}:2"') == 1, (model, log.count(f'"loading: {model}:2"'))
