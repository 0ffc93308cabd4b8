"""The drill harness: a real local Triton and MLflow, one drill at a time, ending in the invariant.

After a scenario and at most one ``seqcls sync``: every endpoint serves the recorded version,
MLflow's champion equals it, nothing is left unready, no temporary file or directory is left
behind (``seqcls status`` agreeing is the check — the same command an operator runs). The
fixtures (``drill``, ``drill_triton``, ``drill_root``, ``drill_store``) are in ``tests/conftest.py``: one
Triton per test module, reset between drills, one release home per test run so the tiny checkpoints are
exported and validated once.

The repository is a directory (``posix``, the default) or a prefix of the session's SeaweedFS (``s3``: a
module that overrides ``drill_repository_kind``, as ``tests/test_drills.py`` does to run every drill on
both). On a store the truth is there (state, lease, versions, configs) and the repository directory is
this host's working copy; the invariant then also looks at the store: an incomplete version there (a
publish killed before its manifest) may wait for gc but is never recorded nor listed by a config.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pytest

from seqcls.config import ReleaseConfig
from seqcls.contract.names import ModelName
from seqcls.localtriton import LocalTriton
from seqcls.ops.status import status
from seqcls.ops.sync import incomplete_versions, stale_temporaries, sync
from seqcls.release.intake import open_release
from seqcls.serving.backend import StoreRepository
from seqcls.serving.objectstore import ObjectStore, S3Credentials, S3Location
from seqcls.serving.repository import Repository
from seqcls.serving.s3repo import served_versions, triton_repository
from seqcls.serving.state import current_state
from seqcls.settings import CONTROL_KEY_FILE as KEY_FILE
from seqcls.settings import PROJECT_ROOT, Settings, store_working_copy
from seqcls.steps import run_release

#: scenario → outcome → seconds to recover; each drill module writes var/test-artifacts/drills-<module>.json
RECORD: list[dict] = []


def write_record(module: str, repository: str | None = None) -> None:
    """``module``'s rows (only those on ``repository``, ``posix`` or ``s3``, when given) to
    ``drills-<module>.json`` (``drills-<module>-s3.json`` for the S3 tier's: another process may write the other)."""
    name = module if repository in (None, "posix") else f"{module}-{repository}"
    out = PROJECT_ROOT / "var" / "test-artifacts" / f"drills-{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [r for r in RECORD if r.get("module") == module and repository in (None, r.get("repository"))]
    out.write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")


def timed_sync(settings: Settings, scenario: str, outcome: str, *, module: str = "test_drills") -> list:
    t0 = time.perf_counter()
    results = sync(settings)
    RECORD.append(
        {
            "module": module,
            "repository": "s3" if settings.triton_store else "posix",
            "scenario": scenario,
            "outcome": outcome,
            "recover_seconds": round(time.perf_counter() - t0, 2),
        }
    )
    return results


def unload_all(server: LocalTriton) -> None:
    """What a restarted replica holds in explicit mode before anything loads: nothing (files untouched)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=server.config.grpc_url)
    headers = server.control_headers()
    for m in client.get_model_repository_index(headers=headers).models:
        if m.state == "READY":
            client.unload_model(m.name, headers=headers)
    deadline = time.monotonic() + 30
    while any(m.state == "READY" for m in client.get_model_repository_index(headers=headers).models):
        assert time.monotonic() < deadline, "models still loaded 30 s after unload"
        time.sleep(0.2)


@dataclass(frozen=True)
class DrillStore:
    """An ``s3://`` repository for one drill module: a fresh prefix of the session's SeaweedFS, served by the
    module's Triton (which needs an explicit control key: a store has no key file)."""

    uri: str
    endpoint: str
    credentials: S3Credentials = field(repr=False)
    control_key: str = field(repr=False)

    #: tritonserver 2.51 refuses to start on a prefix with no object: this one stays through every reset.
    KEEP = "README.txt"

    @classmethod
    def fresh(cls, endpoint: str, bucket: str, credentials: S3Credentials) -> DrillStore:
        drill_store = cls(
            f"s3://{bucket}/drills-{uuid.uuid4().hex[:8]}", endpoint, credentials, secrets.token_urlsafe(32)
        )
        drill_store.objects.put_immutable(cls.KEEP, b"a seqcls drill repository\n")
        return drill_store

    @cached_property
    def objects(self) -> ObjectStore:
        """The prefix's objects (one client: building one costs ~0.2 s)."""
        return ObjectStore(S3Location.parse(self.uri, endpoint=self.endpoint, credentials=self.credentials))

    def env(self) -> dict[str, str]:
        """What points seqcls (this process and the CLI's) at the store: the standard AWS variables and the key."""
        return {
            "SEQCLS_TRITON_REPOSITORY": self.uri,
            "SEQCLS_TRITON_CONTROL_KEY": self.control_key,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.credentials.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.credentials.secret_access_key,
            "AWS_REGION": "us-east-1",
        }

    def triton_config(self) -> dict:
        """:func:`tests.helpers.triton.start_triton`'s keywords for a Triton reading this store."""
        triton = triton_repository(self.objects.location)
        return {"repository": triton.uri, "control_key": self.control_key, "environment": dict(triton.environment)}

    def empty(self, home: Path) -> int:
        """Every object of the prefix deleted (but :attr:`KEEP`), and ``home``'s working copy of it: a drill
        starts on an empty store. Returns how many objects were deleted."""
        keys = [k for k in self.objects.list() if k != self.KEEP]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(self.objects.delete, keys))
        shutil.rmtree(store_working_copy(home, self.uri), ignore_errors=True)
        return len(keys)


def reset(server: LocalTriton, store: DrillStore | None = None, home: Path | None = None) -> None:
    """Every model unloaded, the repository emptied (but the server's control key file; on a store: the
    prefix and ``home``'s working copy of it)."""
    unload_all(server)
    if store is not None:
        assert home is not None, "a store's reset needs the home whose working copy to remove"
        store.empty(home)
        return
    for p in server.config.repository.iterdir():
        if p.name != KEY_FILE:
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def repo_of(settings: Settings, model_name: str = ModelName("seqcls")) -> Repository:
    return Repository.from_settings(settings, model_name)


def store_leftovers(settings: Settings, model_name: str = ModelName("seqcls")) -> list[str]:
    """On an ``s3://`` repository: the incomplete versions on the store (no manifest: a publish that died)
    that the recorded state or a config on the store still names. An unnamed one is left for gc by design
    (its number stays used), so it is not a leftover; [] for a POSIX repository."""
    store = StoreRepository.at(repo_of(settings, model_name).root)
    if store is None:
        return []
    names = ModelName(model_name).names
    state = current_state(store.root, model_name)
    live = {v for v in (state.serving, state.previous, state.candidate) if v is not None}
    found = []
    for model in names.all:  # the candidate route too: it pins a version of its own directory
        config = store.repo.read_config(model)
        listed = set(served_versions(config[0], model)) if config else set()
        for version in store.repo.versions(model).incomplete:
            if version in live | listed:
                found.append(f"{store.repo.uri(f'{model}/{version}/')} (incomplete, yet named by the state or config)")
    return found


@dataclass
class Drill:
    settings: Settings
    server: LocalTriton
    env: dict[str, str]
    #: The object store the repository is on (None: a directory).
    store: DrillStore | None = None

    @property
    def kind(self) -> str:
        return "posix" if self.store is None else "s3"

    @property
    def repo(self) -> Path:
        return Path(str(self.settings.triton_repository))

    def release(self, ckpt: Path, settings: Settings | None = None, **config) -> list:
        return run_release(open_release(ckpt, ReleaseConfig(**config), settings or self.settings))

    def cli(self, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "seqcls.cli", *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def state(self, model_name: str = ModelName("seqcls")):
        return current_state(self.repo, model_name)

    def assert_invariant(self, *, served: int | None = None) -> None:
        """The drill's end condition (see the module docstring)."""
        reports = status(self.settings)
        assert reports, "no recorded state at all"
        for r in reports:
            assert r.agree, "\n".join(r.lines())
        if served is not None:
            assert self.state().serving == served
        # on a store, self.repo is the working copy: its temporaries are this host's (the store has none)
        leftovers = stale_temporaries(repo_of(self.settings)) + incomplete_versions(repo_of(self.settings), set())
        leftovers += list(self.repo.glob(".tmp-*")) + list(self.repo.glob("*.tmp"))
        leftovers += list(self.repo.glob("*/.tmp-fetch-*"))  # a version read back from the store, half-copied
        assert not leftovers, f"temporary files left behind: {leftovers}"
        on_store = store_leftovers(self.settings)
        assert not on_store, f"incomplete versions on the store still named: {on_store}"


def make_drill(
    server: LocalTriton, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: DrillStore | None = None
) -> Drill:
    """A fresh drill on ``server``: its repository emptied (on ``store``, when given), its own MLflow database,
    a shared home."""
    reset(server, store, home)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {
        "SEQCLS_HOME": str(home),
        "SEQCLS_TRITON_REPOSITORY": str(server.config.repository),
        "SEQCLS_TRITON_GRPC": server.config.grpc_url,
        "SEQCLS_TRITON_HTTP": server.config.http_url,
        "SEQCLS_MLFLOW_TRACKING_URI": uri,
        **(store.env() if store is not None else {}),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    env.pop("SEQCLS_FAULT_PLAN", None)
    return Drill(Settings.from_env(), server, env, store)


def when(condition, action, *, timeout: float = 300.0) -> threading.Thread:
    """Run ``action`` the moment ``condition()`` holds (polled every 20 ms), from a watcher thread."""

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if condition():
                    action()
                    return
            except Exception:  # a state file being replaced: look again
                pass
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


#: What marks a test as a drill (real Triton + MLflow; `-m "not drill"` leaves them out).
DRILL = (pytest.mark.slow, pytest.mark.integration, pytest.mark.drill)
#: Texts whose served answers a drill compares before and after what it does.
PROBE_TEXTS = ["the same text before and after", "一段固定的测试文本", "x"]


def drill_test(test):
    """Mark ``test`` as a drill (the unit tests beside it run in the fast tier)."""
    for mark in DRILL:
        test = mark(test)
    return test


def served_answers(d: Drill, model_name: str) -> list:
    """What ``model_name``'s public route answers to :data:`PROBE_TEXTS` now (probabilities rounded to 1e-5)."""
    from seqcls.serving.client import TritonOps, endpoints_from_settings

    preds, probs = TritonOps(endpoints_from_settings(d.settings)[0]).infer(
        PROBE_TEXTS, model=ModelName(model_name).names.ensemble
    )
    return [preds, [[round(float(p), 5) for p in row] for row in probs]]


def champion(settings: Settings, model_name: str = ModelName("seqcls")) -> int | None:
    from seqcls.registry.ledger import CHAMPION, alias_version

    return alias_version(settings, model_name, CHAMPION)
