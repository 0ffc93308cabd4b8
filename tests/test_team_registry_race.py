"""Registry concurrency on the team stack: two clients registering and promoting at the same moment through
the MLflow server on PostgreSQL (the ``team_mlflow`` session fixture), and the registry exactly as each
model's journal and champion history say after every round.

Two spawned processes (two interpreters, two MLflow clients) are released by a barrier into the tail of a
release — run, release lease, journalled version and ``candidate``, attempt ended, ``champion`` —
through the product's functions (``tests/helpers/registry_race.py``), not the ~15 s CLI release.
Two different models race ten rounds; then both act on the same model: the release lease serialises them
(one waits for the other) or refuses one (a lease timeout of 0), never two champions, never a version no
journal knows.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from seqcls.contract.names import ModelName
from seqcls.registry import journal
from seqcls.registry.ledger import CANDIDATE, CHAMPION, CHAMPION_SINCE_TAG, PREVIOUS, client, history
from seqcls.serving.lease import ReleaseLease
from seqcls.settings import Settings
from seqcls_tools.teamstack import MlflowServer, Postgres
from tests.helpers.registry_race import Racers, racers

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROUNDS = 10


@pytest.fixture(scope="module")
def pool(team_mlflow: MlflowServer) -> Iterator[Racers]:
    """Two racing workers for the module (spawning them and importing mlflow costs seconds: once)."""
    if team_mlflow.proc is None or team_mlflow.proc.poll() is not None:
        team_mlflow.start()  # a drill may have killed it
    with racers(team_mlflow.client_env()) as pool:
        yield pool


@pytest.fixture
def settings(home: Path, team_mlflow: MlflowServer, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for key, value in team_mlflow.client_env().items():
        monkeypatch.setenv(key, value)
    return Settings.from_env(home=home)


def job(settings: Settings, model: str, fingerprint: str, triton_version: int, **kw: Any) -> dict[str, Any]:
    where = {"home": str(settings.home), "repository": str(settings.triton_repository)}
    return {**where, "model": model, "fingerprint": fingerprint, "triton_version": triton_version,
            "lease_timeout": 60.0, **kw}  # fmt: skip


def ok(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for r in results:
        assert "error" not in r, r.get("traceback", r)
    return results


def rows(pg: Postgres, model: str) -> dict[str, Any]:
    """What PostgreSQL holds for ``model``: versions (→ run id), their tags, aliases, the champion history.

    Read from the tables, not through the server: every REST call pays basic auth's password hash (~0.1-0.8 s
    here), and the rows are the registry itself. The server's answer is compared once, at the end.
    """
    where = f"name = '{model}'"
    versions = pg.query("mlflow", f"SELECT version, run_id FROM model_versions WHERE {where} AND current_stage <> "
                        "'Deleted_Internal'")  # fmt: skip
    tags: dict[int, dict[str, str]] = {}
    for version, key, value in pg.query("mlflow", f"SELECT version, key, value FROM model_version_tags WHERE {where}"):
        tags.setdefault(version, {})[key] = value
    found = pg.query("mlflow", f"SELECT value FROM registered_model_tags WHERE {where} AND key = 'champion_history'")
    return {
        "versions": dict(versions),
        "tags": tags,
        "aliases": dict(pg.query("mlflow", f"SELECT alias, version FROM registered_model_aliases WHERE {where}")),
        "history": [(h["champion"], h["replaced"]) for h in json.loads(found[0][0] if found else "[]")],
    }


def served_by_mlflow(settings: Settings, model: str) -> dict[str, Any]:
    """The same through the MLflow server, as every client sees it."""
    c = client(settings)
    return {
        "versions": {int(v.version): v.run_id for v in c.search_model_versions(f"name = '{model}'")},
        "aliases": {a: int(v) for a, v in c.get_registered_model(model).aliases.items()},
        "history": [(h["champion"], h["replaced"]) for h in history(c, model)],
    }


def check_registry(settings: Settings, pg: Postgres, model: str, released: list[dict[str, Any]]) -> dict[str, Any]:
    """The registry holds exactly what the attempts journalled, in champion order; returns the rows."""
    journalled: dict[int, str] = {}
    for i, r in enumerate(released):
        changes = [e for e in r["journal"] if e["event"] == "change"]
        expected = ["registered_model"] * (i == 0) + ["version", "created", "alias"]
        assert [e["change"] for e in changes] == expected, changes  # every change journalled before it was made
        version, alias = changes[-2]["version"], changes[-1]
        assert version == r["version"] and changes[-3]["run_id"] == r["run_id"] == changes[-2]["run_id"]
        assert (alias["alias"], alias["target"], alias["previous"]) == (CANDIDATE, version, r["previous_candidate"])
        assert r["created_registered_model"] == (i == 0) and r["dead"] == {"undone": {}, "open": []}
        before = released[i - 1]["version"] if i else None
        assert (r["previous_candidate"], r["previous_champion"]) == (before, before)
        journalled[version] = r["run_id"]
    now = rows(pg, model)
    # no version lost, none duplicated, none the journal does not know
    assert sorted(now["versions"]) == list(range(1, len(released) + 1)) == sorted(journalled)
    assert now["versions"] == journalled
    assert {v: now["tags"][v]["release_key"] for v in journalled} == {r["version"]: r["release_key"] for r in released}
    last = released[-1]["version"]
    aliases = {CHAMPION: last, CANDIDATE: last} | ({PREVIOUS: released[-2]["version"]} if len(released) > 1 else {})
    assert now["aliases"] == aliases
    # one champion: only it says since when, and the history is one unbroken chain of moves
    assert [v for v, t in now["tags"].items() if CHAMPION_SINCE_TAG in t] == [last]
    assert [int(now["tags"][v]["triton_version"]) for v in sorted(journalled)] == [r["triton"] for r in released]
    assert now["history"] == [(r["version"], released[i - 1]["version"] if i else None) for i, r in enumerate(released)]
    path = journal.journal_path(settings, ModelName(model))
    assert path.read_bytes() == b"", journal.read(path)  # every attempt ended: the journal compacted
    assert ReleaseLease(Path(str(settings.triton_repository)), ModelName(model)).holder() is None
    return now


def test_two_models_register_and_promote_at_the_same_moment(
    pool: Racers, settings: Settings, team_postgres: Postgres
) -> None:
    tag = secrets.token_hex(3)
    models = [f"race-{tag}-a", f"race-{tag}-b"]
    released: dict[str, list[dict[str, Any]]] = {m: [] for m in models}
    for n in range(1, ROUNDS + 1):
        jobs = [job(settings, m, secrets.token_hex(32), n) for m in models]
        for m, r in zip(models, ok(pool.round(jobs)), strict=True):
            released[m].append({**r, "triton": n})
        for m in models:
            check_registry(settings, team_postgres, m, released[m])
    for m in models:  # the server answers what its database holds
        now = check_registry(settings, team_postgres, m, released[m])
        assert served_by_mlflow(settings, m) == {k: now[k] for k in ("versions", "aliases", "history")}
    assert len({r["pid"] for rs in released.values() for r in rs}) == 2  # two clients, each its own process


def test_two_releases_of_one_model_are_serialised_or_refused_by_the_lease(
    pool: Racers, settings: Settings, team_postgres: Postgres
) -> None:
    model = f"race-{secrets.token_hex(3)}-same"  # a new model: its experiment and registered model are made here
    # serialised: both want the lease at once, one waits until the other gave it back
    results = ok(pool.round([job(settings, model, secrets.token_hex(32), n) for n in (1, 2)]))
    released = sorted(({**r, "triton": n} for r, n in zip(results, (1, 2), strict=True)), key=lambda r: r["held"][0])
    assert released[0]["held"][1] <= released[1]["held"][0], "both held the release lease at once"
    check_registry(settings, team_postgres, model, released)

    # refused: the lease taken by one, the other told at once (a lease timeout of 0) and changing nothing
    jobs = [job(settings, model, secrets.token_hex(32), 3, lease_timeout=0.0, hold=True) for _ in range(2)]
    results = ok(pool.round(jobs))
    refused = [r for r in results if "refused" in r]
    assert len(refused) == 1, results
    assert "release lease of model" in refused[0]["refused"]
    assert refused[0]["undone"] == {"changed": False, "actions": []}  # it journalled nothing: nothing to undo
    winner = next(r for r in results if "refused" not in r)
    now = check_registry(settings, team_postgres, model, [*released, {**winner, "triton": 3}])
    assert served_by_mlflow(settings, model) == {k: now[k] for k in ("versions", "aliases", "history")}
