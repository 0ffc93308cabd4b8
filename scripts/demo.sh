#!/usr/bin/env bash
# The main job on embedded defaults: build (or reuse) the demo checkpoint and release it.
# Everything lives under var/demo/ (SEQCLS_HOME) unless SEQCLS_HOME is set.
set -euo pipefail
cd "$(dirname "$0")/.."
export SEQCLS_HOME="${SEQCLS_HOME:-$PWD/var/demo/home}"
CKPT="${SEQCLS_DEMO_CHECKPOINT:-$PWD/var/demo/checkpoint}"
SEQCLS=.venv/bin/seqcls
if [ ! -f "$CKPT/config.json" ]; then
  "$SEQCLS" demo-checkpoint "$CKPT"
fi
"$SEQCLS" release --checkpoint "$CKPT"
