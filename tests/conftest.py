"""Fixtures shared across the suite: a real PostgreSQL server, started once per session when a test asks for it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.postgres import PostgresServer, PostgresUnavailable

# The suite never talks to the developer's own cluster: the processes it starts inherit this environment.
for _variable in ("KUBECONFIG", "TIMEKEEPER_KUBECONFIG", "GPUSHARING_KUBECONFIG"):
    os.environ.pop(_variable, None)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """PostgreSQL on 127.0.0.1; a test that needs it FAILS (never skips) when it cannot be started."""
    try:
        server = PostgresServer.start()
    except (PostgresUnavailable, OSError) as exc:
        pytest.fail(f"PostgreSQL could not be started for the test suite: {exc}", pytrace=False)
    yield server
    server.stop()
