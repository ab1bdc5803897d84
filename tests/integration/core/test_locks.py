"""Advisory locks on their own connections, and the pg_locks read the store makes for them."""

from __future__ import annotations

import itertools

import pytest

from scheduling.core import locks

pytestmark = pytest.mark.django_db


def _name_with_key(negative: bool) -> str:
    return next(f"n{i}" for i in itertools.count() if (locks.lock_key("test", f"n{i}") < 0) == negative)


@pytest.mark.parametrize("negative", [False, True], ids=["positive-key", "negative-key"])
def test_is_locked_sees_a_lock_held_on_another_connection_until_it_is_released(negative):
    """is_locked reads pg_locks for the 64-bit key (either sign): true while held elsewhere, false after."""
    name = _name_with_key(negative)
    lock = locks.AdvisoryLock("test", name)
    assert not locks.is_locked("test", name)
    with lock:
        assert locks.is_locked("test", name)
        assert not locks.is_locked("test", name + "-other")
    assert not locks.is_locked("test", name)


def _show(conn, name: str) -> str:
    with conn.cursor() as cur:
        cur.execute(f"SHOW {name}")
        return str(cur.fetchone()[0])


def _on_tcp(conn) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT inet_client_addr() IS NOT NULL")
        return bool(cur.fetchone()[0])


def test_a_lock_session_asks_the_server_to_end_it_soon_after_its_client_vanishes():
    """The session holding an advisory lock carries the server-side keepalives, user timeout and idle
    limits (PostgreSQL keeps a silently vanished client's session for the OS keepalive time otherwise)."""
    with locks.AdvisoryLock("test", "bounded") as lock:
        conn = lock._conn
        assert _show(conn, "idle_in_transaction_session_timeout") == f"{locks.IDLE_IN_TRANSACTION_SECONDS}s"
        assert _show(conn, "client_connection_check_interval") == f"{locks.CLIENT_CHECK_INTERVAL_MS // 1000}s"
        if not _on_tcp(conn):
            pytest.skip("the test database is reached over a Unix socket: the tcp_* settings read 0 there")
        assert _show(conn, "tcp_keepalives_idle") == str(locks.SERVER_KEEPALIVE_IDLE_SECONDS)
        assert _show(conn, "tcp_keepalives_interval") == str(locks.SERVER_KEEPALIVE_INTERVAL_SECONDS)
        assert _show(conn, "tcp_keepalives_count") == str(locks.SERVER_KEEPALIVE_COUNT)
        assert _show(conn, "tcp_user_timeout") == str(locks.SERVER_USER_TIMEOUT_MS)  # shown in ms
    idle, interval, count = (
        locks.SERVER_KEEPALIVE_IDLE_SECONDS,
        locks.SERVER_KEEPALIVE_INTERVAL_SECONDS,
        locks.SERVER_KEEPALIVE_COUNT,
    )
    assert idle + interval * count <= locks.VANISHED_CLIENT_BOUND_SECONDS <= 30, "the documented bound holds"
    assert locks.SERVER_USER_TIMEOUT_MS / 1000 <= locks.VANISHED_CLIENT_BOUND_SECONDS


def test_a_leader_lock_session_is_bounded_like_every_dedicated_session():
    """The leadership's own lock session (beat's, the control loop's) carries the same server-side bounds."""
    from scheduling.core import leadership

    lead = leadership.Leadership("test-bounded")
    assert lead.lead()
    try:
        assert _show(lead.connection, "idle_in_transaction_session_timeout") == f"{locks.IDLE_IN_TRANSACTION_SECONDS}s"
        assert _show(lead.connection, "lock_timeout") == "0", "taking a lock never waits anyway"
    finally:
        lead.resign()
