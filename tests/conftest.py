"""Fixtures shared across the suite: a real PostgreSQL server, started once per session when a test asks for it.

Property tests (hypothesis) run the `ci` profile: few examples, the same ones every run, seconds per test.
HYPOTHESIS_PROFILE=long runs thousands of fresh examples per test, by hand.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from testbed.postgres import PostgresServer, PostgresUnavailable

# The suite never talks to the developer's own cluster: the processes it starts inherit this environment.
for _variable in ("KUBECONFIG", "TIMEKEEPER_KUBECONFIG", "GPUSHARING_KUBECONFIG"):
    os.environ.pop(_variable, None)
# The fuzz tests share one app across examples (a database per example would cost more than the example).
_SHARED_APP = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
settings.register_profile(
    "ci", max_examples=150, derandomize=True, deadline=None, database=None, suppress_health_check=_SHARED_APP
)
settings.register_profile("long", max_examples=5000, deadline=None, suppress_health_check=_SHARED_APP)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """PostgreSQL on 127.0.0.1; a test that needs it FAILS (never skips) when it cannot be started."""
    try:
        server = PostgresServer.start()
    except (PostgresUnavailable, OSError) as exc:
        pytest.fail(f"PostgreSQL could not be started for the test suite: {exc}", pytrace=False)
    yield server
    server.stop()
