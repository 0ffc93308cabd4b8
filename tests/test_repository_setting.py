"""An object-store URI seqcls has no backend for is refused, naming the setting — not taken for a local path;
an ``s3://`` one becomes this host's working copy of that store (:mod:`seqcls.serving.storeroot`).

Triton itself loads ``s3://``, ``gs://`` and ``as://`` repositories, so an operator may well try
``SEQCLS_TRITON_REPOSITORY=s3://host:port/bucket/repo``; seqcls publishes with atomic renames and
``flock`` on a POSIX directory, and without this check created ``./s3:/host:port/bucket/repo`` in the
current directory and released there, while nothing reached the bucket.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from seqcls.errors import InputError
from seqcls.serving.storeroot import store_uri
from seqcls.settings import ENV_TRITON_REPOSITORY, Settings


@pytest.mark.parametrize("uri", ["gs://bucket/repo", "as://account/container/repo", "S3://b/r"])
def test_an_object_store_repository_is_refused_naming_the_setting(
    uri: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV_TRITON_REPOSITORY, uri)
    with pytest.raises(InputError, match=rf"{ENV_TRITON_REPOSITORY}.*{uri.split('://')[0]}://.*POSIX directory"):
        Settings.from_env()
    with pytest.raises(InputError, match="object store"):
        Settings(triton_repository=uri)  # the Triton Connection's extra `repository` arrives this way
    assert list(tmp_path.iterdir()) == []  # nothing created in the current directory


def test_the_cli_exits_with_the_message_and_creates_nothing(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "SEQCLS_HOME": str(tmp_path / "home"),
        ENV_TRITON_REPOSITORY: "gs://127.0.0.1:9000/m/r",
    }
    out = subprocess.run(
        [sys.executable, "-m", "seqcls.cli", "status"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, (out.returncode, out.stdout[-1000:], out.stderr[-2000:])
    assert "SEQCLS_TRITON_REPOSITORY" in out.stderr and "gs://127.0.0.1:9000/m/r" in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "s3:").exists()


def test_a_local_path_is_still_a_path(tmp_path: Path) -> None:
    assert Settings(triton_repository=tmp_path / "repo").triton_repository == tmp_path / "repo"
    assert Path(Settings(triton_repository="relative/repo").triton_repository) == Path("relative/repo")


def test_an_s3_repository_is_a_working_copy_named_after_its_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV_TRITON_REPOSITORY, "s3://models/repo")
    settings = Settings.from_env(home=tmp_path / "home")
    assert settings.triton_store == "s3://models/repo"
    root = Path(str(settings.triton_repository))
    assert root == (tmp_path / "home" / "triton" / "stores" / "s3" / "models" / "repo").resolve()
    assert store_uri(root) == "s3://models/repo"
    assert store_uri(tmp_path) is None and store_uri(tmp_path / "triton" / "stores" / "s3") is None  # POSIX
    with pytest.raises(InputError, match=r"no '\.' or '\.\.' segments"):
        Settings(home=tmp_path, triton_repository="s3://b/../x")
    assert not (tmp_path / "s3:").exists()
