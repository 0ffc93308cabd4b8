"""An ``s3://`` model repository named by the Triton Connection, its store's credentials by an AWS-type one.

The Triton Connection's extra ``repository`` may be ``s3://bucket/prefix`` (kept as a URI, never folded
into a relative ``s3:`` directory), and its extra ``store_conn_id`` (default ``aws_default``) names the
Connection whose key id, secret, session token, endpoint and region reach the object store through the
standard AWS variables while a task runs — masked, and gone after. Through the real part: a task's
settings reach the session's SeaweedFS with credentials only the Connection holds.
"""

from __future__ import annotations

import json
import os
import secrets

import pytest

from tests.helpers.airflow import private_airflow_home
from tests.helpers.seaweedfs import SeaweedFS, seaweedfs

AIRFLOW_HOME = private_airflow_home()  # before anything imports airflow
__all__ = ["seaweedfs"]  # the fixture, imported for this module's tests

AWS_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION")


def _connections(monkeypatch: pytest.MonkeyPatch, conns: dict[str, dict]) -> None:
    for name, conn in conns.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{name.upper()}", json.dumps(conn))


def test_the_store_connection_reaches_the_aws_variables_only_while_the_task_runs(
    monkeypatch: pytest.MonkeyPatch, home
) -> None:
    from airflow.sdk._shared.secrets_masker import redact

    from seqcls.airflow.hooks import TritonHook
    from seqcls.airflow.tasks import connected
    from seqcls.settings import aws_s3_environment

    store = {"endpoint_url": "http://s3.team:8333", "region_name": "eu-west-1", "aws_session_token": "tok-s3-456"}
    _connections(
        monkeypatch,
        {
            "triton_s3": {"conn_type": "triton", "extra": {"repository": "s3://models/team/a", "store_conn_id": "s3t"}},
            "s3t": {"conn_type": "aws", "login": "AKIDTEAM", "password": "secret-s3-123", "extra": store},
            "half": {"conn_type": "aws", "login": "AKIDONLY"},
        },
    )
    for name in AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDWORKER")  # the worker's own, back after the task
    with connected({"triton_conn_id": "triton_s3", "mlflow_conn_id": "nope"}) as settings:
        assert settings.triton_store == "s3://models/team/a"
        assert settings.triton_repository.parts[-4:] == ("s3", "models", "team", "a")  # the working copy
        assert aws_s3_environment() == {
            "endpoint": "http://s3.team:8333",
            "region": "eu-west-1",
            "access_key_id": "AKIDTEAM",
            "secret_access_key": "secret-s3-123",
            "session_token": "tok-s3-456",
        }
    assert {n: v for n in AWS_VARS if (v := os.environ.get(n))} == {"AWS_ACCESS_KEY_ID": "AKIDWORKER"}
    for secret in ("secret-s3-123", "tok-s3-456"):
        assert redact(f"x {secret} y") == "x *** y", secret
    # a directory repository reads no store Connection; a missing one falls back to the workers' variables
    assert TritonHook("triton_s3").store_env("/models") == {}
    assert TritonHook("nope").store_env("s3://models/x") == {}  # aws_default is not defined here
    with pytest.raises(Exception, match=r"connection 'half': an access key id needs its secret access key"):
        _connections(monkeypatch, {"triton_half": {"conn_type": "triton", "extra": {"store_conn_id": "half"}}})
        TritonHook("triton_half").store_env("s3://models/x")


@pytest.mark.integration
def test_a_task_reaches_the_store_with_credentials_only_its_connection_holds(
    monkeypatch: pytest.MonkeyPatch, home, seaweedfs: SeaweedFS
) -> None:
    from seqcls.airflow.tasks import connected
    from seqcls.serving.storeroot import store_at

    prefix = f"conn-{secrets.token_hex(4)}"
    creds = seaweedfs.credentials
    _connections(
        monkeypatch,
        {
            "triton_weed": {
                "conn_type": "triton",
                "extra": {"repository": f"s3://{seaweedfs.bucket}/{prefix}", "store_conn_id": "weed"},
            },
            "weed": {
                "conn_type": "aws",
                "login": creds.access_key_id,
                "password": creds.secret_access_key,
                "extra": {"endpoint_url": seaweedfs.endpoint, "region_name": "us-east-1"},
            },
        },
    )
    for name in AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    with connected({"triton_conn_id": "triton_weed", "mlflow_conn_id": "nope"}) as settings:
        store = store_at(settings.triton_repository)
        assert store is not None
        store.create("probe.json", b'{"from": "the connection"}')
        assert store.list() == ["probe.json"]
    assert seaweedfs.store(prefix).read("probe.json")[0] == b'{"from": "the connection"}'
