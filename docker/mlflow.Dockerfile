# The compose file's MLflow server: MLflow's own image, plus the PostgreSQL driver (backend store and the
# basic-auth database on the stack's postgres) and Flask-WTF (MLflow's basic-auth app), pinned as in
# requirements.txt / requirements.lock; the entrypoint writes the basic-auth ini from the environment.
FROM ghcr.io/mlflow/mlflow:v3.17.2
RUN pip install --no-cache-dir psycopg2-binary==2.9.13 Flask-WTF==1.3.0
COPY tools/seqcls_tools/compose_mlflow.py /opt/seqcls/compose_mlflow.py
ENTRYPOINT ["python", "/opt/seqcls/compose_mlflow.py"]
