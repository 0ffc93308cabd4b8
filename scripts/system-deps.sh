#!/usr/bin/env bash
# Debian packages seqcls needs besides Python packages; installs only what is missing.
#   libpython3.11  — the tritonserver python backend stub links against it
#   docker-compose — validates docker-compose.airflow.yml without a Docker engine (tests)
#   chromium       — the Airflow UI test drives a real headless browser
#   libb64-0d      — perf_analyzer (the benchmark's load generator, requirements-perf.txt) links it
#   prometheus     — `promtool` checks and unit-tests the alerting/recording rules and the dashboard
#                    queries, and the `prometheus` server runs them on a real Triton's metrics text
#                    (tests/test_monitoring_rules.py; under CI a missing binary fails, not skips)
#   fonts-wqy-zenhei — a CJK font: label names like 组织关系##裁员 in the UI screenshots and the plots
#   postgresql     — the team registry tier: a throwaway cluster (initdb + pg_ctl) under the compose file's
#                    MLflow server (seqcls_tools.teamstack; under CI a missing binary fails, not skips)
#   redis-server   — the team stack's Celery broker (Airflow's CeleryExecutor, as in the compose file)
set -euo pipefail
need=()
python3.11 -c 'import sysconfig,sys; sys.exit(0 if sysconfig.get_config_var("Py_ENABLE_SHARED") else 1)' 2>/dev/null \
  || ldconfig -p 2>/dev/null | grep -q 'libpython3\.11\.so' || need+=(libpython3.11)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d' || need+=(libb64-0d)
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || need+=(prometheus)
{ ls /usr/lib/postgresql/*/bin/initdb || command -v initdb; } >/dev/null 2>&1 || need+=(postgresql)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
{ command -v fc-list >/dev/null 2>&1 && fc-list :lang=zh | grep -q .; } || need+=(fonts-wqy-zenhei)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: installing ${need[*]} (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
  echo "system-deps: please install these Debian packages: ${need[*]} (sudo apt-get install ${need[*]})" >&2
fi
