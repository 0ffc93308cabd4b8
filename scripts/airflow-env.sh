# shellcheck shell=bash
# Environment for a local embedded Airflow running the seqcls DAG (sqlite, LocalExecutor).
#
#   source scripts/airflow-env.sh        # then: airflow db migrate; airflow dags list; ...
#
# Everything already set in the caller's environment wins, so tests and CI can point
# AIRFLOW_HOME at a temporary directory. Nothing here touches ~/airflow.

_seqcls_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

export AIRFLOW_HOME="${AIRFLOW_HOME:-${_seqcls_root}/var/airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="${AIRFLOW__CORE__DAGS_FOLDER:-${_seqcls_root}/dags}"
export AIRFLOW__CORE__PLUGINS_FOLDER="${AIRFLOW__CORE__PLUGINS_FOLDER:-${_seqcls_root}/plugins}"
export AIRFLOW__CORE__LOAD_EXAMPLES="${AIRFLOW__CORE__LOAD_EXAMPLES:-False}"
# The default (32) forks 32 LocalExecutor workers; a release needs one at a time.
export AIRFLOW__CORE__PARALLELISM="${AIRFLOW__CORE__PARALLELISM:-4}"
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="${AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION:-True}"
# Loopback UI/API (airflow api-server); tasks reach the execution API there too.
export AIRFLOW__API__HOST="${AIRFLOW__API__HOST:-127.0.0.1}"
export AIRFLOW__API__PORT="${AIRFLOW__API__PORT:-8080}"
export AIRFLOW__API__BASE_URL="${AIRFLOW__API__BASE_URL:-http://${AIRFLOW__API__HOST}:${AIRFLOW__API__PORT}}"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="${AIRFLOW__CORE__EXECUTION_API_SERVER_URL:-${AIRFLOW__API__BASE_URL}/execution/}"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:-${AIRFLOW_HOME}/simple_auth_manager_passwords.json.generated}"
# The scheduler's health endpoint (off unless enabled) would bind 0.0.0.0.
export AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST="${AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST:-127.0.0.1}"
# No secret is set here: Airflow generates the JWT secret, API secret key and Fernet key into
# ${AIRFLOW_HOME}/airflow.cfg (mode 0600) on its first command, once per home.
# Not loopback: `airflow scheduler` / `airflow triggerer` started by hand fork a task-log server on
# every interface (ports 8793/8794; Airflow 3.3 has no option for its address). Start them with
# --skip-serve-logs, or use `make airflow-ui`, which serves task logs on 127.0.0.1 only.

# The seqcls venv's airflow/seqcls commands first on PATH.
if [ -d "${_seqcls_root}/.venv/bin" ]; then
  case ":${PATH}:" in
    *":${_seqcls_root}/.venv/bin:"*) ;;
    *) export PATH="${_seqcls_root}/.venv/bin:${PATH}" ;;
  esac
fi

mkdir -p "${AIRFLOW_HOME}"
unset _seqcls_root
