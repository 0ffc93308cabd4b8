"""The entrypoint of the compose file's ``mlflow`` image: basic auth configured from the environment, then
``mlflow server`` with the service's command line.

Why: MLflow's basic-auth app reads its admin user and its database from an ini file
(``MLFLOW_AUTH_CONFIG_PATH``), and a password must not be baked into an image or the compose file;
this writes the file (0600) from ``MLFLOW_ADMIN_USERNAME`` / ``MLFLOW_ADMIN_PASSWORD`` /
``MLFLOW_AUTH_DATABASE_URI`` at start. ``MLFLOW_AUTH_CACHE_TTL_SECONDS`` turns on MLflow's cache of verified
credentials: without it every request pays a deliberately slow password hash, the dominant cost of a release's
~70 requests on a small server; the price is that a password changed out of band is honoured up to that many
seconds late. The local rehearsal (:mod:`seqcls_tools.teamstack`) writes
it with the same function. Standard library only: it runs inside MLflow's image.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REQUIRED = ("MLFLOW_ADMIN_USERNAME", "MLFLOW_ADMIN_PASSWORD", "MLFLOW_AUTH_DATABASE_URI")
#: Seconds a verified credential is remembered by the server (MLflow's ``auth_cache_ttl_seconds``; 0: off).
CACHE_TTL = "MLFLOW_AUTH_CACHE_TTL_SECONDS"


def auth_ini(env: dict[str, str]) -> str:
    """The basic-auth ini for ``env``; a missing variable is named."""
    missing = [name for name in REQUIRED if not env.get(name)]
    if missing:
        raise SystemExit(f"mlflow basic auth: set {', '.join(missing)} (see docker/README.md)")
    ttl = env.get(CACHE_TTL, "0").strip() or "0"
    if not ttl.isdigit():
        raise SystemExit(f"mlflow basic auth: {CACHE_TTL} must be a whole number of seconds (0: off), got {ttl!r}")
    return (
        "[mlflow]\n"
        "default_permission = READ\n"
        f"database_uri = {env['MLFLOW_AUTH_DATABASE_URI']}\n"
        f"admin_username = {env['MLFLOW_ADMIN_USERNAME']}\n"
        f"admin_password = {env['MLFLOW_ADMIN_PASSWORD']}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        f"auth_cache_ttl_seconds = {int(ttl)}\n"
    )


def main(argv: list[str]) -> None:
    path = Path(os.environ.get("MLFLOW_AUTH_CONFIG_PATH", "/tmp/basic_auth.ini"))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(auth_ini(dict(os.environ)))
    os.environ["MLFLOW_AUTH_CONFIG_PATH"] = str(path)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
