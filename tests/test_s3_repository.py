"""Triton versions published to an ``s3://`` repository (seqcls.serving.s3repo) and a real Triton serving them.

Through real parts: a SeaweedFS ``weed server`` on loopback (:mod:`tests.helpers.seaweedfs`) and the
``tritonserver`` of the nvidia-pytriton wheel started by :class:`seqcls.localtriton.LocalTriton` on
``s3://127.0.0.1:PORT/bucket/prefix`` in explicit mode, credentials in its environment only. The model is
a small python-backend model laid out as publish lays out a version (``model.py``, the empty
``__pycache__`` file, the config snapshot, ``release.json`` recording every file's sha256) whose answer
comes from a file of its version, so an answer names the bytes Triton loaded. A publish killed before its
manifest is a real SIGKILL (``die@publish:before-store-marker``) of a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

from seqcls.errors import InputError, ServingError
from seqcls.localtriton import LocalTriton, TritonServerConfig
from seqcls.serving.objectstore import ObjectConflict, ObjectStore, S3Credentials, S3Location
from seqcls.serving.repository import version_policy
from seqcls.serving.s3repo import MANIFEST, S3Repository, served_versions, triton_repository
from seqcls.settings import PROJECT_ROOT
from tests.helpers.seaweedfs import SeaweedFS, running, seaweedfs
from tests.helpers.triton import start_triton

__all__ = ["seaweedfs"]  # the fixture, imported for this module's tests

MODEL = "s3echo"
SECRET = "wJalrXUtnFEMI-never-shown"
KEY_ID = "AKIDNEVERSHOWN01"

MODEL_PY = """
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

ANSWER = (Path(__file__).parent / "answer.txt").read_text(encoding="utf-8").strip()


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            out = np.array([[f"{t[0].decode()}: {ANSWER}".encode()] for t in texts], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("ANSWER", out)]))
        return responses
"""


def config(versions: list[int], name: str = MODEL, policy: str | None = None) -> str:
    return f"""name: "{name}"
backend: "python"
max_batch_size: 4
{policy or version_policy(versions)}
input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "ANSWER" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


def local_version(root: Path, version: int, answer: str) -> Path:
    """``root/<model>/<version>/`` as publish writes it, its ``release.json`` recording each file's sha256."""
    vdir = root / MODEL / str(version)
    vdir.mkdir(parents=True)
    files = {
        "model.py": MODEL_PY.encode(),
        "answer.txt": f"{answer}\n".encode(),
        "__pycache__": b"",  # publish's empty file: the stub cannot write bytecode into a version
        "config.snapshot.pbtxt": config([version]).encode(),
    }
    for name, data in files.items():
        (vdir / name).write_bytes(data)
    recorded = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    info = {"model": MODEL, "version": version, "files": recorded}
    (vdir / "release.json").write_text(json.dumps(info), encoding="utf-8")
    return vdir


@pytest.fixture
def repo(seaweedfs: SeaweedFS) -> S3Repository:
    return S3Repository(seaweedfs.store(f"repo-{uuid.uuid4().hex[:8]}"))


# --- the manifest as the completion marker (real SeaweedFS, no Triton) ----------------------------------------


@pytest.mark.integration
def test_a_version_is_uploaded_object_by_object_and_its_manifest_records_what_was_uploaded(
    repo: S3Repository, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    vdir = local_version(tmp_path, 1, "first")
    with caplog.at_level(logging.INFO, logger="seqcls.serving.s3repo"):
        result = repo.publish_version(MODEL, 1, vdir)
    local = {p.name: p.read_bytes() for p in vdir.iterdir()}
    assert (result.model, result.version, result.objects) == (MODEL, 1, len(local))
    assert result.bytes == sum(len(d) for d in local.values()) and result.manifest_key.endswith(f"1/{MANIFEST}")
    manifest = repo.manifest(MODEL, 1)
    assert manifest is not None
    assert {n: (f.sha256, f.size) for n, f in manifest.files.items()} == {
        n: (hashlib.sha256(d).hexdigest(), len(d)) for n, d in local.items()
    }
    for name, data in local.items():  # each object carries its sha256, checked on read
        assert repo.store.read_immutable(f"{MODEL}/1/{name}") == data
    assert (repo.versions(MODEL).complete, repo.versions(MODEL).incomplete) == ((1,), ())
    assert f"published {MODEL} version 1" in caplog.text and f"{len(local)} objects" in caplog.text


@pytest.mark.integration
def test_a_used_version_number_is_refused_marked_or_not(repo: S3Repository, tmp_path: Path) -> None:
    repo.publish_version(MODEL, 1, local_version(tmp_path / "a", 1, "first"))
    with pytest.raises(ServingError, match=r"version 1 of 's3echo' already has 6 object\(s\) \(complete\).*version 2"):
        repo.publish_version(MODEL, 1, local_version(tmp_path / "b", 1, "other"))
    repo.store.put_immutable(f"{MODEL}/2/model.py", b"# a publish that died here")
    with pytest.raises(ServingError, match=r"version 2 .* 1 object\(s\) \(incomplete: no manifest.*version 3"):
        repo.publish_version(MODEL, 2, local_version(tmp_path / "c", 2, "second"))
    assert (repo.versions(MODEL).complete, repo.versions(MODEL).incomplete) == ((1,), (2,))


@pytest.mark.integration
def test_a_local_file_changed_after_verification_leaves_an_incomplete_version(
    repo: S3Repository, tmp_path: Path
) -> None:
    vdir = local_version(tmp_path, 1, "first")
    (vdir / "model.py").write_text("# changed after release.json recorded its hash\n", encoding="utf-8")
    with pytest.raises(ServingError, match=r"model\.py has sha256 [0-9a-f]{12}, its release\.json recorded"):
        repo.publish_version(MODEL, 1, vdir)
    assert repo.manifest(MODEL, 1) is None
    assert repo.versions(MODEL).complete == ()


@pytest.mark.integration
def test_a_directory_unlike_its_release_json_is_refused_before_anything_is_written(
    repo: S3Repository, tmp_path: Path
) -> None:
    vdir = local_version(tmp_path, 1, "first")
    (vdir / "stray.bin").write_bytes(b"not recorded")
    (vdir / "answer.txt").unlink()
    with pytest.raises(InputError, match=r"unrecorded \['stray\.bin'\], missing \['answer\.txt'\]"):
        repo.publish_version(MODEL, 1, vdir)
    (vdir / "release.json").unlink()
    with pytest.raises(InputError, match=r"release\.json is missing"):
        repo.publish_version(MODEL, 1, vdir)
    assert repo.store.list() == []


@pytest.mark.integration
def test_a_config_is_written_only_over_complete_versions_and_only_with_a_specific_policy(
    repo: S3Repository, tmp_path: Path
) -> None:
    repo.publish_version(MODEL, 1, local_version(tmp_path, 1, "first"))
    repo.store.put_immutable(f"{MODEL}/2/model.py", b"# a publish that died here")
    with pytest.raises(ServingError, match=rf"may not serve version 2: its marker .*{MODEL}/2/{MANIFEST} is missing"):
        repo.write_config(MODEL, config([1, 2]), None)
    with pytest.raises(InputError, match="serves only listed versions"):
        repo.write_config(MODEL, config([], policy="version_policy: { latest: { num_versions: 1 } }"), None)
    with pytest.raises(InputError, match="its name is 'other'"):
        repo.write_config(MODEL, config([1], name="other"), None)
    assert repo.read_config(MODEL) is None, "a refused config was written"
    first = repo.write_config(MODEL, config([1]), None)
    assert (first.versions, first.replaced_etag) == ((1,), None)
    assert repo.read_config(MODEL) == (config([1]), first.etag)
    repo.store.delete(f"{MODEL}/1/answer.txt")  # a complete version damaged on the store
    with pytest.raises(ServingError, match=r"lists 1 object\(s\) the store lacks \(answer\.txt\)"):
        repo.write_config(MODEL, config([1]) + "# touched\n", first.etag)
    assert served_versions(config([3, 1, 3]), MODEL) == (1, 3)


@pytest.mark.integration
def test_two_writers_of_one_config_read_with_the_same_etag_exactly_one_wins(
    seaweedfs: SeaweedFS, tmp_path: Path
) -> None:
    prefix = f"cas-{uuid.uuid4().hex[:8]}"
    setup = S3Repository(seaweedfs.store(prefix))
    for version in (1, 2, 3):
        setup.publish_version(MODEL, version, local_version(tmp_path, version, f"answer {version}"))
    etag = setup.write_config(MODEL, config([1]), None).etag
    writers = {"A": config([1, 2]), "B": config([1, 3])}
    barrier, outcomes = threading.Barrier(2), {}

    def write(name: str) -> None:
        mine = S3Repository(seaweedfs.store(prefix))  # its own client, as another process would have
        mine.read_config(MODEL)  # connected before the start line
        barrier.wait()
        try:
            outcomes[name] = mine.write_config(MODEL, writers[name], etag)
        except ObjectConflict as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=write, args=(n,)) for n in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [n for n, o in outcomes.items() if not isinstance(o, Exception)]
    assert len(won) == 1, outcomes
    (lost,) = set(writers) - set(won)
    message = str(outcomes[lost])
    assert f"{MODEL}/config.pbtxt changed since it was read (it had ETag {etag})" in message
    assert "another writer's config won" in message and "Read it again" in message
    assert setup.read_config(MODEL) == (writers[won[0]], outcomes[won[0]].etag)


# --- Triton on s3:// (no server for the first two) -----------------------------------------------------------------


def test_triton_s_repository_form_and_its_credentials_travel_apart() -> None:
    creds = S3Credentials(KEY_ID, SECRET, "TOKEN-never-shown")
    local = triton_repository(S3Location.parse("s3://models/team/a/", endpoint="http://127.0.0.1:8333"))
    assert local.uri == "s3://127.0.0.1:8333/models/team/a"
    tls = triton_repository(S3Location.parse("s3://models/a", endpoint="https://minio.example", credentials=creds))
    assert tls.uri == "s3://https://minio.example:443/models/a"
    assert tls.environment == {
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": "TOKEN-never-shown",
    }
    assert SECRET not in repr(tls)
    assert triton_repository(S3Location.parse("s3://models", region="eu-west-1")).uri == "s3://models"
    with pytest.raises(InputError, match="without a path"):
        triton_repository(S3Location.parse("s3://m/a", endpoint="http://host:1/sub"))


def test_a_local_triton_takes_an_s3_repository_with_the_credentials_in_its_environment_only(tmp_path: Path) -> None:
    key = secrets.token_urlsafe(32)
    env = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET}
    cfg = TritonServerConfig("s3://127.0.0.1:8333/models/a/", control_key=key, environment=env, state_dir=tmp_path)
    assert cfg.repository == "s3://127.0.0.1:8333/models/a" and cfg.remote
    cmd = cfg.command(tmp_path / "server", "seqcls-00000000-")
    assert "--model-repository=s3://127.0.0.1:8333/models/a" in cmd
    assert all(SECRET not in part and KEY_ID not in part for part in [*cmd, repr(cfg), json.dumps(cfg.options())])
    assert cfg.process_environment({"PATH": "/bin"}) == {"PATH": "/bin", **env}
    cfg.prepare_repository()  # nothing local to create
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with pytest.raises(InputError, match="has no control key file; pass control_key"):
        TritonServerConfig("s3://127.0.0.1:8333/models/a", state_dir=tmp_path)
    with pytest.raises(InputError, match=r"takes a directory or s3://"):
        TritonServerConfig("gs://models/a", control_key=key, state_dir=tmp_path)
    assert TritonServerConfig(tmp_path / "repo", state_dir=tmp_path).remote is False


def _infer(server: LocalTriton, text: str, version: str = "") -> str:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=server.grpc_url)
    inp = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
    result = client.infer(MODEL, [inp], model_version=version, client_timeout=30)
    return result.as_numpy("ANSWER")[0][0].decode()


def _load(server: LocalTriton) -> dict[str, bool]:
    """Explicit load (Triton reads config.pbtxt from the store again), then readiness of versions 1-3."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=server.grpc_url)
    client.load_model(MODEL, headers=server.control_headers(), client_timeout=120)
    return {v: client.is_model_ready(MODEL, v) for v in ("1", "2", "3")}


def _killed_publish(seaweedfs: SeaweedFS, prefix: str, version: int, source: Path) -> subprocess.CompletedProcess:
    """``publish_version`` in its own process, SIGKILLed just before the manifest; credentials from AWS_*."""
    script = (
        "import sys; from pathlib import Path\n"
        "from seqcls.serving.objectstore import ObjectStore, S3Location\n"
        "from seqcls.serving.s3repo import S3Repository\n"
        "from seqcls.settings import aws_s3_environment\n"
        "location = S3Location.parse(sys.argv[1], environment=aws_s3_environment())\n"
        "S3Repository(ObjectStore(location)).publish_version(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT / "plugins"), str(PROJECT_ROOT)]),
        "AWS_ENDPOINT_URL_S3": seaweedfs.endpoint,
        "AWS_ACCESS_KEY_ID": seaweedfs.credentials.access_key_id,
        "AWS_SECRET_ACCESS_KEY": seaweedfs.credentials.secret_access_key,
        "SEQCLS_FAULT_PLAN": "die@publish:before-store-marker",
    }
    argv = [sys.executable, "-c", script, f"s3://{seaweedfs.bucket}/{prefix}", MODEL, str(version), str(source)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.integration
def test_triton_serves_from_s3_and_never_a_version_whose_publish_died(seaweedfs: SeaweedFS, tmp_path: Path) -> None:
    prefix = f"triton-{uuid.uuid4().hex[:8]}"
    location = seaweedfs.location(prefix)
    repo = S3Repository(ObjectStore(location))
    repo.publish_version(MODEL, 1, local_version(tmp_path / "local", 1, "first weights"))
    etag = repo.write_config(MODEL, config([1]), None).etag
    triton = triton_repository(location)
    server = start_triton(
        tmp_path, repository=triton.uri, control_key=secrets.token_urlsafe(32), environment=triton.environment
    )
    try:
        assert server.status().repository == triton.uri
        assert _load(server) == {"1": True, "2": False, "3": False}
        assert _infer(server, "hello") == "hello: first weights"

        repo.publish_version(MODEL, 2, local_version(tmp_path / "local", 2, "second weights"))
        text, read_etag = repo.read_config(MODEL) or ("", "")
        assert served_versions(text, MODEL) == (1,) and read_etag == etag
        repo.write_config(MODEL, config([2]), read_etag)
        assert _load(server) == {"1": False, "2": True, "3": False}
        assert _infer(server, "hello") == "hello: second weights"

        died = _killed_publish(seaweedfs, prefix, 3, local_version(tmp_path / "local", 3, "third weights"))
        assert died.returncode == -9, died.stderr[-2000:]
        listing = repo.versions(MODEL)
        assert (listing.complete, listing.incomplete) == ((1, 2), (3,))
        assert len(repo.store.list(f"{MODEL}/3/")) == 5, "the killed publish wrote every object but the manifest"
        current, current_etag = repo.read_config(MODEL) or ("", "")
        with pytest.raises(ServingError, match=rf"may not serve version 3: its marker .*{MODEL}/3/{MANIFEST}"):
            repo.write_config(MODEL, config([2, 3]), current_etag)
        assert repo.read_config(MODEL) == (current, current_etag)
        assert _load(server) == {"1": False, "2": True, "3": False}
        assert _infer(server, "still") == "still: second weights"
        assert _infer(server, "pinned", version="2") == "pinned: second weights"
    finally:
        server.stop()
    log_text = server.log_path.read_text(encoding="utf-8", errors="replace")
    assert seaweedfs.credentials.secret_access_key not in log_text


@pytest.mark.integration
def test_weed_keeps_its_logs_in_its_own_directory_and_leaves_no_socket_in_tmp(tmp_path: Path) -> None:
    """weed's glog files go to the fixture's directory; its gRPC sockets, at paths it fixes in /tmp, are
    there while it runs and gone once it is stopped (a killed weed leaves them: the fixture removes them)."""
    with running(tmp_path) as server:
        assert any(p.name.startswith("weed.") for p in (tmp_path / "logs").iterdir()), "no glog file in its logs"
        assert [s for s in server.sockets() if s.exists()], "weed made none of the sockets this test expects"
        server.store("litter").create("k", b"v")
    litter = [p.name for p in Path("/tmp").glob(f"weed.*.{server.pid}")]
    litter += [s.name for s in server.sockets() if s.exists()]
    assert not litter, f"weed left these in /tmp: {litter}"
