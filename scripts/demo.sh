#!/usr/bin/env bash
# The main job on embedded defaults (see README): `seqcls demo` trains or reuses the demo
# checkpoint, starts the local Triton, runs the seqcls_release DAG with Airflow on sqlite and
# prints what is served. State lives under var/demo/ (SEQCLS_DEMO_DIR to move it).
# KEEP=1 leaves the local Triton running afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
[ "${KEEP:-}" = "1" ] && args+=(--keep-servers)
exec .venv/bin/seqcls demo "${args[@]}"
