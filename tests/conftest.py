"""Fixtures shared across the suite: a real PostgreSQL server, started once per session when a test asks for it.

The suite's tiers are markers (registered in setup.cfg, under --strict-markers), given here by path and fixture so
that any tier runs alone with `-m` (docs/development.md#the-tiers):

- `e2e`: tests/e2e/, on a real control plane, one per session: the tier runs in a pytest process of its own, without
  xdist (each worker would start another control plane);
- `cluster`: tests/cluster/, the control plane with kube-scheduler and simulated GPU nodes, likewise;
- `postgres`: the tests that need a PostgreSQL server: the `postgres` fixture, directly or through another fixture,
  or a `postgresql` parameter (database_url's and its likes, which ask for the server when they run), and
  tests/test_postgres.py, which starts servers of its own.

`make test-fast` runs what needs none of them (`-m "not e2e and not cluster and not postgres"`) in parallel, with
xdist's `--dist loadscope`: a module's tests stay on one worker, so that a module-scoped fixture (a server, a render)
is set up once. (`--dist loadgroup` would group by marks, but pytest-xdist 3.8 cannot on pytest 9.2: its group
suffix no longer reaches the node ids, pytest-dev/pytest-xdist#1386.)

Property tests (hypothesis) run the `ci` profile: few examples, the same ones every run, seconds per test.
HYPOTHESIS_PROFILE=long runs thousands of fresh examples per test, by hand.
"""

from __future__ import annotations

import functools
import gc
import os
from collections.abc import Iterator
from pathlib import Path

import kubernetes_validate.utils
import pytest
from hypothesis import HealthCheck, settings

from gpusharing.serving.server import GC_THRESHOLDS
from testbed.postgres import PostgresServer, PostgresUnavailable

# The suite never talks to the developer's own cluster: the processes it starts inherit this environment.
for _variable in ("KUBECONFIG", "TIMEKEEPER_KUBECONFIG", "GPUSHARING_KUBECONFIG"):
    os.environ.pop(_variable, None)
# kubernetes_validate reads a kind's schema, and the 1.6 MB of definitions every kind refers to, from disk for each
# object it validates: read once per process instead (the files are the package's own, never changed).
kubernetes_validate.utils.schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)
# The fuzz tests share one app across examples (a database per example would cost more than the example).
_SHARED_APP = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
settings.register_profile(
    "ci", max_examples=150, derandomize=True, deadline=None, database=None, suppress_health_check=_SHARED_APP
)
settings.register_profile("long", max_examples=5000, deadline=None, suppress_health_check=_SHARED_APP)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


TESTS = Path(__file__).parent
CONTROL_PLANE_TIERS = ("e2e", "cluster")  # tests/<tier>/
POSTGRES_FIXTURES = {"postgres", "postgres_database"}
POSTGRES_MODULES = {TESTS / "test_postgres.py"}  # servers of their own, not the session's
# The modules of the parallel tiers that take longest (each tens of seconds: `--durations` shows them), collected
# first so that xdist hands them out first and its workers end together instead of waiting on one long module.
LONG_MODULES = tuple(
    TESTS / path
    for path in (
        "demo/test_demo.py",
        "timekeeper/test_serve.py",
        "timekeeper/test_rollups.py",
        "sidecar/test_meter_process.py",
        "timekeeper/test_idle.py",
        "webhook/test_serve.py",
        "timekeeper/test_evictions.py",
        "manifests/test_chart.py",
        "gpusharing/test_graceful_shutdown.py",
        "timekeeper/chargeback/test_focus.py",
    )
)


def needs_postgres(item: pytest.Item) -> bool:
    if item.path in POSTGRES_MODULES or POSTGRES_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "postgresql" in callspec.params.values()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.relative_to(TESTS).parts if item.path.is_relative_to(TESTS) else ()
        if len(parts) > 1 and parts[0] in CONTROL_PLANE_TIERS:
            item.add_marker(parts[0])
        if needs_postgres(item):
            item.add_marker("postgres")
    items.sort(key=lambda item: item.path not in LONG_MODULES)  # stable: each module's tests keep their order


def pytest_collection_finish() -> None:
    # What collection made lives as long as the session: frozen out of every garbage collection, and the young
    # generation collected less often, as the servers' workers do (gpusharing.serving.server).
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


_running: list[pytest.Item] = []  # the test being run: a session fixture's request names the session only


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> None:
    _running[:] = [item]


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """PostgreSQL on 127.0.0.1; a test that needs it FAILS (never skips) when it cannot be started.

    So does a test that asks for it without the `postgres` marker (a way of asking that needs_postgres() does not
    see): `-m "not postgres"` must never need the server."""
    unmarked = [item.nodeid for item in _running if item.get_closest_marker("postgres") is None]
    if unmarked:
        pytest.fail(f"{unmarked[0]} needs PostgreSQL but has no `postgres` marker: teach needs_postgres() in "
                    "tests/conftest.py how it asks for the server", pytrace=False)
    try:
        server = PostgresServer.start()
    except (PostgresUnavailable, OSError) as exc:
        pytest.fail(f"PostgreSQL could not be started for the test suite: {exc}", pytrace=False)
    yield server
    server.stop()
