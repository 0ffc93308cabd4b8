"""The base-size release timing tool reads the CLI's logs in both of their formats."""

from __future__ import annotations

from seqcls_tools.bench.release_time import log_lines


def test_log_lines_take_both_formats_and_keep_offsets() -> None:
    text = "\n".join(
        [
            "[2026-12-03 20:04:37,500] [    INFO] model.py:128 - bench: built",
            "2026-12-03 20:04:38,000 INFO seqcls.steps.convert: convert: applying serving profile int8",
            "2026-12-03T20:04:40.250000Z [info     ] optimize: done [seqcls.profiles.optimize] loc=optimize.py:131",
            "\x1b[32m[2026-12-03 20:04:41,000] paddlenlp's coloured line is not a step's",
            "a traceback line",
        ]
    )
    assert log_lines(text) == [
        (0.0, "bench: built"),
        (0.5, "INFO seqcls.steps.convert: convert: applying serving profile int8"),
        (2.8, "[info     ] optimize: done"),
    ]
