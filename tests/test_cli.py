"""CLI manners: --version, the documented exit codes, --json where a command reports state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seqcls.cli import main


def test_version_prints_the_installed_package_version() -> None:
    from importlib.metadata import version

    out = subprocess.run([sys.executable, "-m", "seqcls.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"seqcls {version('seqcls')}"


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["lease", "break"])  # --model-name missing
    assert exc.value.code == 2


def test_lease_break_reports_json(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lease", "break", "--model-name", "alpha", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"model_name": "alpha", "broken": None}


def test_a_bad_model_name_is_a_clear_error_with_exit_1(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--model-name", "alpha_model"]) == 1
    assert "collide" in capsys.readouterr().err


def test_the_configuration_reference_names_every_release_flag() -> None:
    """The documented flag list cannot drift from the parser (README's hand-written one once lacked --prob-atol
    and --hierarchy): docs/configuration.md's reference is generated, and must name every flag of `release`."""
    from seqcls.cli import build_parser
    from seqcls_tools.docs.reference import render

    release = build_parser()._subparsers._group_actions[0].choices["release"]  # argparse has no public API for it
    flags = {opt for action in release._actions for opt in action.option_strings if opt.startswith("--")}
    reference = render()
    missing = sorted(f for f in flags - {"--help"} if f"`{f}`" not in reference)
    assert not missing, f"the configuration reference does not mention {missing}"


def test_a_mistyped_option_or_command_gets_the_closest_one(capsys: pytest.CaptureFixture[str]) -> None:
    from seqcls.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["status", "--modle-name", "alpha"])
    assert exit_info.value.code == 2
    assert "--modle-name: did you mean --model-name?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["relese"])
    assert "did you mean 'release'?" in capsys.readouterr().err
