# Airflow 3.3 image with seqcls installed (docker-compose.airflow.yml builds it; context: repo root).
# The base image already ships apache-airflow (and its providers, psycopg2 for Postgres): the
# project's pinned requirements are installed on top of it with Airflow held at the base version,
# then the seqcls package itself — a wheel built from this repository in the first stage, installed
# --no-deps (its dependencies are the pins just installed): the library and the serving modules of
# model_repository/common (not the development tools, tools/). Airflow finds it as an installed package:
# the provider (connection types triton, mlflow) and the plugin (task extra links) through its entry
# points, the DAGs import it from site-packages. Nothing is imported from a plugins folder.

# ---- stage 1: the seqcls wheel (what `pip wheel .` builds from the repository; a throw-away stage,
# built as root: the source tree and build/ live in a root-owned directory)
FROM apache/airflow:3.3.2-python3.11 AS wheel
USER root
WORKDIR /tmp/seqcls
COPY pyproject.toml setup.cfg README.md ./
COPY plugins/ ./plugins/
COPY model_repository/common/ ./model_repository/common/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /tmp/wheels .

# ---- stage 2: the image
FROM apache/airflow:3.3.2-python3.11

USER root
# libgomp1: OpenMP runtime that paddlepaddle's libpaddle.so links against.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && apt-get autoremove -yqq --purge \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /opt/seqcls/dags /opt/seqcls/plugins /opt/airflow/secrets /models /seqcls/home /seqcls/checkpoints \
 && chown -R airflow:0 /opt/seqcls /opt/airflow/secrets /models /seqcls
USER airflow

WORKDIR /opt/seqcls
COPY --chown=airflow:0 requirements.txt ./
# requirements.txt pins apache-airflow itself: drop that line and pin the image's own version
# instead (AIRFLOW_VERSION is set by the base image), as the image's docs recommend.
RUN grep -vE '^apache-airflow(\[[^]]*\])?==' requirements.txt > /tmp/requirements-image.txt \
 && pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /tmp/requirements-image.txt \
 && rm /tmp/requirements-image.txt

COPY --from=wheel --chown=airflow:0 /tmp/wheels/ /opt/seqcls/wheels/
# Fails the build unless Airflow sees the provider (its info validated against Airflow's schema)
# and the plugin (a throw-away AIRFLOW_HOME: nothing is written to the image's).
RUN pip install --no-cache-dir --no-deps /opt/seqcls/wheels/seqcls-*.whl \
 && rm -rf /opt/seqcls/wheels \
 && AIRFLOW_HOME=/tmp/airflow-check airflow providers get seqcls -o json > /dev/null \
 && AIRFLOW_HOME=/tmp/airflow-check airflow plugins -o json | grep -q '"name": "seqcls"' \
 && rm -rf /tmp/airflow-check

# The Triton model repository template the publish step copies from: config templates and model.py
# files (the package's default is the source tree's model_repository/, which an installed wheel does
# not have). Its common/ is the same bytes as the wheel's serving modules (one build context); a
# differing copy would be refused (seqcls.contract.shipped).
COPY --chown=airflow:0 model_repository/ ./model_repository/
# dags/ is not baked in: the compose file bind-mounts ./dags onto /opt/seqcls/dags (the Kubernetes
# image, deploy/kubernetes/airflow.Dockerfile, copies it there). /opt/seqcls/plugins is an empty
# plugins folder for site-specific plugins.

ENV AIRFLOW__CORE__DAGS_FOLDER=/opt/seqcls/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/seqcls/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    SEQCLS_MODEL_REPOSITORY_SOURCE=/opt/seqcls/model_repository
WORKDIR /opt/airflow
