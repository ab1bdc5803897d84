"""deploy/postgres-init against a private PostgreSQL: the application's role migrates and is no superuser.

The compose file mounts the script into the postgres image's ``docker-entrypoint-initdb.d``; the
image runs it once, as its superuser, with ``POSTGRES_USER``/``POSTGRES_DB`` set and psql reaching
the server. Here the same script runs the same way against a server of our own (the machine's
shared PostgreSQL is never touched), then ``manage.py migrate`` runs as the role it made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import psycopg2
import pytest

from tests.e2e import harness, private_services

pytestmark = [pytest.mark.e2e]

SCRIPT = harness.ROOT / "deploy" / "postgres-init" / "10-timekeeper-role.sh"


def test_the_init_script_makes_a_role_that_migrates_and_is_no_superuser():
    """As the script's role: migrate succeeds, the tables are its own, and it cannot create roles or databases."""
    if shutil.which("psql") is None:
        pytest.skip("psql is missing (apt-get install postgresql-client)")
    base = private_services._scratch_dir("tk-pg-role-")
    pg = private_services.PrivatePostgres(base)
    password = f"app-{uuid.uuid4().hex}"
    try:
        pg.initdb()
        pg.start()
        conn = pg.connect("postgres")
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE timekeeper")  # the image makes POSTGRES_DB before its init scripts
        conn.close()
        env = {
            "PATH": os.environ["PATH"],
            "POSTGRES_USER": "postgres",
            "POSTGRES_DB": "timekeeper",
            "PGHOST": "127.0.0.1",
            "PGPORT": str(pg.port),
            "TIMEKEEPER_DB_PASSWORD": password,
        }
        done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert password not in done.stdout + done.stderr

        url = f"postgresql://timekeeper:{password}@127.0.0.1:{pg.port}/timekeeper"
        private_services.migrate(url, base / "migrate.log")

        admin = pg.connect()
        with admin.cursor() as cur:
            cur.execute(
                "SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls FROM pg_roles"
                " WHERE rolname = 'timekeeper'"
            )
            assert cur.fetchone() == (False, False, False, False, False)
            cur.execute("SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'")
            assert cur.fetchall() == [("timekeeper",)]
            cur.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'scheduling_scheduledjob'")
            assert cur.fetchone() == (1,)
        admin.close()

        app = psycopg2.connect(url, connect_timeout=5)
        app.autocommit = True
        with app.cursor() as cur:
            cur.execute("SELECT current_user, count(*) FROM scheduling_scheduledjob")
            assert cur.fetchone() == ("timekeeper", 0)
            refused = ("CREATE ROLE intruder SUPERUSER", "CREATE DATABASE other", "ALTER ROLE timekeeper SUPERUSER")
            for statement in refused:
                with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                    cur.execute(statement)
        app.close()
    finally:
        pg.shutdown()
        shutil.rmtree(base, ignore_errors=True)
