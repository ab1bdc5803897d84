#!/bin/bash
# Run once by the postgres image's entrypoint on an empty data directory (docker-entrypoint-initdb.d),
# as the image's superuser (POSTGRES_USER). Creates the role the application uses: it logs in, owns
# the timekeeper database (so `manage.py migrate` can create its tables) and is not a superuser
# (no CREATEDB, no CREATEROLE, no replication, no way round row ownership or file access).
# The password comes from the environment through psql's \getenv: never on a command line.
set -euo pipefail

: "${TIMEKEEPER_DB_PASSWORD:?set TIMEKEEPER_DB_PASSWORD (the password of the application role)}"
TIMEKEEPER_DB_USER="${TIMEKEEPER_DB_USER:-timekeeper}"
export TIMEKEEPER_DB_USER

psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
\getenv app_user TIMEKEEPER_DB_USER
\getenv app_password TIMEKEEPER_DB_PASSWORD
CREATE ROLE :"app_user" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    PASSWORD :'app_password';
ALTER DATABASE :"DBNAME" OWNER TO :"app_user";
ALTER SCHEMA public OWNER TO :"app_user";
REVOKE ALL ON DATABASE :"DBNAME" FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE :"DBNAME" TO :"app_user";
SQL
