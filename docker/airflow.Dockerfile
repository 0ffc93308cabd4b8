# Airflow 3.3 image with seqcls installed (docker-compose.airflow.yml builds it; context: repo root).
# The base image already ships apache-airflow (and its providers, psycopg2 for Postgres): the
# project's pinned requirements are installed on top of it with Airflow held at the base version.
FROM apache/airflow:3.3.2-python3.11

USER root
# libgomp1: OpenMP runtime that paddlepaddle's libpaddle.so links against.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && apt-get autoremove -yqq --purge \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /opt/seqcls/dags /opt/airflow/secrets /models /seqcls/home /seqcls/checkpoints \
 && chown -R airflow:0 /opt/seqcls /opt/airflow/secrets /models /seqcls
USER airflow

WORKDIR /opt/seqcls
# README.m[d]: copied when present (pyproject names it), no error when absent.
COPY --chown=airflow:0 requirements.txt pyproject.toml README.m[d] ./
# requirements.txt pins apache-airflow itself: drop that line and pin the image's own version
# instead (AIRFLOW_VERSION is set by the base image), as the image's docs recommend.
RUN grep -vE '^apache-airflow(\[[^]]*\])?==' requirements.txt > /tmp/requirements-image.txt \
 && pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /tmp/requirements-image.txt \
 && rm /tmp/requirements-image.txt

COPY --chown=airflow:0 plugins/ ./plugins/
COPY --chown=airflow:0 model_repository/ ./model_repository/
# dags/ is not baked in: the compose file bind-mounts ./dags onto /opt/seqcls/dags.
# Editable install: the `seqcls` CLI exists and imports from /opt/seqcls/plugins, the same path
# the compose file bind-mounts ./plugins onto (and uses as Airflow's plugins folder).
RUN pip install --no-cache-dir --no-deps -e /opt/seqcls

ENV AIRFLOW__CORE__DAGS_FOLDER=/opt/seqcls/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/seqcls/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False
WORKDIR /opt/airflow
