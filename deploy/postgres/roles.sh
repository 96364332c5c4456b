#!/usr/bin/env bash
# Tenure's PostgreSQL roles (guide::production, "PostgreSQL: TLS in the URL,
# least-privilege roles"; guide::security): run once by the postgres image on an
# empty data directory, as the superuser. The privileges on Tenure's tables are
# granted after each migration by the schema's owner (`tenure migrate
# --grant-worker tenure_worker --grant-producer tenure_producer`, the compose
# file's `migrate` service); the operator role's with FenceStore::grant_operator.
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v migrator_pw="$TENURE_MIGRATOR_PASSWORD" \
  -v worker_pw="$TENURE_WORKER_PASSWORD" \
  -v producer_pw="$TENURE_PRODUCER_PASSWORD" <<'SQL'
CREATE ROLE tenure_migrator LOGIN PASSWORD :'migrator_pw'; -- owns Tenure's schema
CREATE ROLE tenure_worker   LOGIN PASSWORD :'worker_pw';   -- runs jobs
CREATE ROLE tenure_producer LOGIN PASSWORD :'producer_pw'; -- enqueues (the application)
CREATE ROLE tenure_admin    NOLOGIN;                       -- operators: cancel, redrive, prune
SELECT format('GRANT CONNECT, CREATE ON DATABASE %I TO tenure_migrator', current_database()) \gexec
SELECT format('GRANT CONNECT ON DATABASE %I TO tenure_worker, tenure_producer', current_database()) \gexec
SQL
