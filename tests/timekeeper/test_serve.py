"""`gpusharing timekeeper serve` and `gpusharing db upgrade` as real processes: a bad setting is one line before any
worker starts, and what the timekeeper does to namespaces and pods is in its log."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from sqlalchemy import create_engine

from demo.kubeapi import FakeKube
from demo.processes import Service, free_port, run_command
from testbed.postgres import PostgresServer
from testbed.timekeeper_processes import ControllerProcess
from tests.timekeeper.conftest import ADMIN, METER
from timekeeper.database.schema import schema_problem
from timekeeper.services import OFF_CLUSTER

OFF_CLUSTER_ENV = {"KUBERNETES_SERVICE_HOST": "", "KUBECONFIG": "", "TIMEKEEPER_KUBECONFIG": ""}


@pytest.fixture
def migrated(sqlite_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "timekeeper.sqlite"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({}, OFF_CLUSTER),  # the default, tokenreview, where there is no cluster
        (
            {"TIMEKEEPER_AUTH": "static", "TIMEKEEPER_STATIC_TOKENS_FILE": "{tmp}/missing"},
            "TIMEKEEPER_STATIC_TOKENS_FILE={tmp}/missing: cannot read it: No such file or directory",
        ),
        (
            {"TIMEKEEPER_AUTH": "none", "TIMEKEEPER_KUBECONFIG": "{tmp}/missing"},
            "cannot configure the Kubernetes API from the kubeconfig {tmp}/missing (TIMEKEEPER_KUBECONFIG, else "
            "KUBECONFIG): "
            "Invalid kube-config file. No configuration found.",
        ),
        (
            {"TIMEKEEPER_AUTH": "none", "TIMEKEEPER_KUBECONFIG": "{tmp}/not-yaml"},
            "the kubeconfig {tmp}/not-yaml (TIMEKEEPER_KUBECONFIG, else KUBECONFIG) is not one: while parsing a flow "
            "node",
        ),
        (
            {"TIMEKEEPER_AUTH": "none", "TIMEKEEPER_DATABASE_URL": "mysql://tk:secret@db/tk"},
            "TIMEKEEPER_DATABASE_URL=mysql://tk:***@db/tk: the timekeeper speaks SQLite and PostgreSQL only: use "
            "sqlite:///PATH or "
            "postgresql+psycopg://USER:PASSWORD@HOST:5432/DATABASE",
        ),
    ],
)
def test_a_bad_setting_stops_serve_before_any_worker_with_one_line_saying_what_to_set(
    settings: dict[str, str], message: str, migrated: str, tmp_path: Path
) -> None:
    (tmp_path / "not-yaml").write_text("clusters: [")
    env = {
        **OFF_CLUSTER_ENV,
        "TIMEKEEPER_DATABASE_URL": migrated,
        **{k: v.format(tmp=tmp_path) for k, v in settings.items()},
    }
    result = run_command("timekeeper", "serve", "--host", "127.0.0.1", "--port", str(free_port()), env=env)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [f"gpusharing: {message.format(tmp=tmp_path)}"]


def test_db_upgrade_takes_a_postgres_url_as_providers_print_it(postgres: PostgresServer) -> None:
    url = postgres.create_database("provider_url")
    upgraded = run_command("db", "upgrade", "--database-url", url.replace("postgresql+psycopg://", "postgres://"))
    assert upgraded.returncode == 0, upgraded.stderr
    engine = create_engine(url)
    assert schema_problem(engine) is None
    engine.dispose()


@pytest.mark.parametrize(
    ("url", "status", "message"),
    [
        (
            "postgres://tk:secret@127.0.0.1:{port}/tk",
            1,
            "cannot migrate the database postgresql+psycopg://tk:***@127.0.0.1:{port}/tk: ",
        ),
        (
            "sqlite:///{tmp}/no/such/directory/tk.sqlite",
            1,
            "cannot migrate the database sqlite:///{tmp}/no/such/directory/tk.sqlite: unable to open database file",
        ),
        ("not a url", 2, "--database-url is not a database URL: use sqlite:///PATH or postgresql+psycopg://"),
    ],
)
def test_db_upgrade_of_a_database_it_cannot_reach_is_one_line_without_the_password(url: str, status: int, message: str,
                                                                                    tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    result = run_command("db", "upgrade", "--database-url", url.format(port=port, tmp=tmp_path))
    assert result.returncode == status  # 1: the database cannot be reached or opened; 2: the setting is no URL
    [line] = [line for line in result.stderr.splitlines() if line.startswith("gpusharing:")]
    assert line.startswith(f"gpusharing: {message.format(port=port, tmp=tmp_path)}") and "secret" not in result.stderr
    assert "Traceback" not in result.stderr


def test_the_controller_alone_watches_the_pods_and_its_metrics_count_what_it_caches(
    migrated: str, tokens_file: str, fake_kube: FakeKube, tmp_path: Path
) -> None:
    """One pod watch against the API server, the controller's, whatever the web replica's workers; its cache listed a
    page at a time (1,200 governed pods: three pages), its size on its /metrics."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(fake_kube.kubeconfig())
    for i in range(1200):
        fake_kube.add_pod("team-a", f"train-{i:04d}")
    fake_kube.add_pod("team-a", "no-gpu", share=None)  # not governed: not kept
    port = free_port()
    env = {
        "TIMEKEEPER_DATABASE_URL": migrated,
        "TIMEKEEPER_AUTH": "static",
        "TIMEKEEPER_STATIC_TOKENS_FILE": tokens_file,
        "TIMEKEEPER_KUBECONFIG": str(kubeconfig),
    }
    with Service("timekeeper", ["timekeeper", "serve", "--host", "127.0.0.1", "--port", str(port), "--workers", "2"],
                 f"http://127.0.0.1:{port}/readyz", env=env, log_path=tmp_path / "timekeeper.log"), \
            ControllerProcess(migrated, tmp_path / "controller.log", **env) as controller:
        fake_kube.reset_watch_peaks()
        deadline = time.monotonic() + 30
        while (cached := controller.metric('gpusharing_controller_cached_objects{kind="governed GPU pods"}')) != 1200:
            assert time.monotonic() < deadline, f"the controller's /metrics says {cached} pods cached"
            time.sleep(0.1)
        time.sleep(1.5)  # the fake ends each watch within 0.5 s: every watch held was opened again meanwhile
        assert fake_kube.watches_peak["pods"] == 1
    assert fake_kube.count("GET", "/api/v1/pods") >= 3  # the list's three pages (and the watches)


def test_a_crossing_a_transition_and_an_eviction_each_leave_an_info_line(
    migrated: str, tokens_file: str, fake_kube: FakeKube, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(fake_kube.kubeconfig())
    pod = fake_kube.add_pod("team-a", "train-0")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        "TIMEKEEPER_DATABASE_URL": migrated,
        "TIMEKEEPER_AUTH": "static",
        "TIMEKEEPER_STATIC_TOKENS_FILE": tokens_file,
        "TIMEKEEPER_KUBECONFIG": str(kubeconfig),
        "TIMEKEEPER_DEMOTION_INTERVAL_SECONDS": "0.2",
        "GPUSHARING_LOG_FORMAT": "json",
    }
    log, controller_log = tmp_path / "timekeeper.log", tmp_path / "controller.log"
    with (
        Service(
            "timekeeper",
            ["timekeeper", "serve", "--host", "127.0.0.1", "--port", str(port)],
            f"{url}/readyz",
            env=env,
            log_path=log,
        ),
        ControllerProcess(migrated, controller_log, **env),
    ):
        admin = {"Authorization": f"Bearer {ADMIN}"}
        set_ = requests.put(
            f"{url}/api/v1/budgets/team-a", json={"gpuMinutes": 1, "evictOnExhaustion": True}, headers=admin, timeout=10
        )
        assert set_.status_code == 201
        report = {
            "podUid": pod["metadata"]["uid"],
            "namespace": "team-a",
            "pod": "train-0",
            "gpuShare": 1,
            "seq": 1,
            "gpuSeconds": 90,
        }
        answer = requests.post(
            f"{url}/api/v1/reports", json=report, headers={"Authorization": f"Bearer {METER}"}, timeout=10
        )
        assert answer.json()["state"] == "over-budget"
        deadline = time.monotonic() + 30
        while ("team-a", "train-0") not in fake_kube.evicted:
            assert time.monotonic() < deadline, "the pod was never evicted"
            time.sleep(0.05)

    # Every line is JSON, gunicorn's too; the web replica logs the crossing, the controller what it did of it.
    entries = [json.loads(line) for path in (log, controller_log) for line in path.read_text().splitlines()]
    info = [e for e in entries if e["level"] == "info" and e.get("namespace") == "team-a"]
    assert any(
        e.get("actor") == "alice" and e["message"].startswith("namespace team-a: budget set by alice") for e in info
    )
    assert any(e["message"] == "namespace team-a went over its GPU budget: the report of pod train-0" for e in info)
    assert any(e.get("state") == "over-budget" and e.get("event") == "GPUBudgetExhausted" for e in info)
    assert any(
        e.get("pod") == "train-0"
        and e.get("eviction") == "evicted"
        and e["message"].startswith("evicted pod team-a/train-0")
        for e in info
    )


def test_a_replica_loads_neither_the_kubernetes_client_nor_the_postgresql_driver_it_does_not_use() -> None:
    """Each takes longer to import than the rest of the API: a replica on static tokens and SQLite skips both, as
    does the command line until it reaches a cluster."""
    imported = subprocess.run(
        [sys.executable, "-c", "import sys, timekeeper.app, timekeeper.cli, gpusharing.admin.client; "
         "print(sorted(sys.modules))"],
        capture_output=True, text=True, check=True,
    )
    modules = imported.stdout.split("'")
    assert "timekeeper.app" in modules and "flask" in modules and "sqlalchemy" in modules
    assert not [name for name in modules if name.startswith(("kubernetes", "psycopg"))]
