"""The eval set as part of the contract: kept once per home and read from that copy by every later task,
refused in seconds and in bounded memory when it is too large to score or too small to decide on.

Real intake on the tiny checkpoint; the 200 MB refusal runs in a child interpreter so its peak memory is
its own (``ru_maxrss``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from seqcls.config import ReleaseConfig
from seqcls.errors import InputError
from seqcls.release.intake import open_release, reopen_release
from seqcls.release.kept import kept_eval_set, preflight_eval_set
from seqcls.settings import Settings


def _eval_file(path: Path, checkpoint: Path, n: int) -> Path:
    labels = (checkpoint / "label.txt").read_text(encoding="utf-8").split()
    rows = [f"第{i}条新闻文本，用于评估。\t{labels[i % len(labels)]}\n" for i in range(n)]
    path.write_text("".join(rows), encoding="utf-8")
    return path


def test_a_later_task_scores_the_kept_copy_when_the_original_is_gone(
    tiny_checkpoint: Path, tiny_checkpoint_b_src: Path, home: Path, tmp_path: Path
) -> None:
    es_file = _eval_file(tmp_path / "eval.txt", tiny_checkpoint, 60)
    config, settings = ReleaseConfig(eval_set=str(es_file)), Settings(home=home)
    release = open_release(tiny_checkpoint, config, settings)
    kept = preflight_eval_set(release)
    assert kept is not None and len(kept.texts) == 60
    es_file.unlink()  # the operator's file is gone before evaluate runs (another task, another worker)
    later = reopen_release(settings, config, release.checkpoint.fingerprint)
    again = kept_eval_set(later)
    assert again is not None and (again.sha256, again.texts, again.labels) == (kept.sha256, kept.texts, kept.labels)
    # kept once per home by content: a second release judged on the same bytes shares the copy
    _eval_file(es_file, tiny_checkpoint, 60)
    other = open_release(tiny_checkpoint_b_src, config, settings)
    assert preflight_eval_set(other).sha256 == kept.sha256
    assert sorted(p.name for p in settings.eval_sets_dir.iterdir()) == [f"{kept.sha256}.txt"]
    assert not list(settings.releases_dir.rglob("evalset")), "no per-workspace copy"


@pytest.mark.parametrize("n", [1, 49])
def test_an_eval_set_too_small_to_decide_on_is_refused_at_resolve(
    tiny_checkpoint: Path, home: Path, tmp_path: Path, n: int
) -> None:
    es_file = _eval_file(tmp_path / "eval.txt", tiny_checkpoint, n)
    release = open_release(tiny_checkpoint, ReleaseConfig(eval_set=str(es_file)), Settings(home=home))
    with pytest.raises(InputError, match=rf"{n} labeled text\(s\), fewer than the 50 .*min_eval_texts"):
        preflight_eval_set(release)
    lowered = ReleaseConfig(eval_set=str(es_file), min_eval_texts=n, override="quality", override_reason="a pilot")
    small = open_release(tiny_checkpoint, lowered, Settings(home=home))
    assert len(preflight_eval_set(small).texts) == n  # the floor is the release's: lowering it is an override


def test_more_texts_than_a_release_scores_are_refused_naming_the_setting(
    tiny_checkpoint: Path, home: Path, tmp_path: Path
) -> None:
    es_file = _eval_file(tmp_path / "eval.txt", tiny_checkpoint, 120)
    release = open_release(tiny_checkpoint, ReleaseConfig(eval_set=str(es_file)), Settings(home=home))
    release.settings = Settings(home=home, eval_set_max_texts=100)
    with pytest.raises(InputError, match=r"more than 100 labeled texts .*SEQCLS_EVAL_SET_MAX_TEXTS"):
        preflight_eval_set(release)


REFUSE_LARGE = textwrap.dedent(
    """
    import json, resource, sys, time
    from pathlib import Path
    from seqcls.config import ReleaseConfig
    from seqcls.errors import InputError
    from seqcls.release.intake import open_release
    from seqcls.release.kept import preflight_eval_set
    from seqcls.settings import Settings
    checkpoint, home, eval_file = sys.argv[1:4]
    release = open_release(checkpoint, ReleaseConfig(eval_set=eval_file), Settings(home=home))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    try:
        preflight_eval_set(release)
        outcome = "accepted"
    except InputError as exc:
        outcome = str(exc)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"outcome": outcome, "seconds": seconds, "rss_before_mb": before / 1024,
                      "rss_peak_mb": after / 1024}))
    """
)


def test_a_200_mb_eval_set_is_refused_in_seconds_in_bounded_memory(
    tiny_checkpoint: Path, home: Path, tmp_path: Path
) -> None:
    big = tmp_path / "big.txt"
    line = "凌云航空确认优化研发部门人员，裁员比例约为3%。\t组织关系\n".encode()
    with big.open("wb") as fh:
        block = line * (1_000_000 // len(line))
        while fh.tell() < 200_000_000:
            fh.write(block)
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", REFUSE_LARGE, str(tiny_checkpoint), str(home), str(big)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "MB, over the 50 MB an eval set may have (SEQCLS_EVAL_SET_MAX_MB)" in got["outcome"], got
    assert got["seconds"] < 5 and time.perf_counter() - t0 < 60, got
    assert got["rss_peak_mb"] - got["rss_before_mb"] < 20, got  # refused from its size: nothing was read
