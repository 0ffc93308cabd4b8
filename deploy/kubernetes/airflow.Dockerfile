# The Airflow image for the cluster: docker/airflow.Dockerfile's image (Airflow + seqcls, plugins
# baked in) plus the DAGs. Baked, not git-synced: the DAG derives its tasks, params and flags from
# the step table in plugins/seqcls, so DAG and library must come from the same commit.
#
#   docker build -f docker/airflow.Dockerfile -t seqcls-airflow:local .
#   docker build -f deploy/kubernetes/airflow.Dockerfile -t <registry>/seqcls-airflow:<tag> .
#
# Build context: the repository root.
ARG BASE_IMAGE=seqcls-airflow:local
FROM ${BASE_IMAGE}
COPY --chown=airflow:0 dags/ /opt/seqcls/dags/
