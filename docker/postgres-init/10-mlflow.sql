-- MLflow's backend store and its basic-auth database, beside Airflow's metadata database (run once by
-- the postgres image on an empty volume; the local rehearsal, seqcls_tools.teamstack, runs this file too).
CREATE ROLE mlflow LOGIN PASSWORD 'mlflow';
CREATE DATABASE mlflow OWNER mlflow;
CREATE DATABASE mlflow_auth OWNER mlflow;
