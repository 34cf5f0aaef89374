#!/bin/sh
# Runs once, when the PostgreSQL container initialises its data directory: the two roles of
# deploy/README.md ("Database roles"). baton_migrate owns the database objects and runs the DDL
# ('twin -migrate'); baton_app is the runtime role, given DML rights only by that migration.
set -eu
psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" \
  -v migrate_pw="$BATON_MIGRATE_PASSWORD" -v app_pw="$BATON_APP_PASSWORD" <<'SQL'
CREATE ROLE baton_migrate LOGIN PASSWORD :'migrate_pw';
CREATE ROLE baton_app LOGIN PASSWORD :'app_pw';
GRANT CONNECT, CREATE ON DATABASE baton TO baton_migrate;
GRANT CONNECT ON DATABASE baton TO baton_app;
GRANT USAGE, CREATE ON SCHEMA public TO baton_migrate;
GRANT USAGE ON SCHEMA public TO baton_app;
SQL
