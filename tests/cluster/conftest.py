"""The cluster tier: the project on a control plane with kube-scheduler and simulated GPU nodes
(tests/cluster/nodes.py).

Runs where KUBEBUILDER_ASSETS names a directory with etcd, kube-apiserver and kube-scheduler (and
kube-controller-manager for Jobs, ReplicaSets and PodDisruptionBudgets); elsewhere it is skipped with a line saying
how to enable it, except under CI=true, where a missing control plane fails.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusharing.gpu.catalogue import shipped_catalogue
from tests.cluster.nodes import NodeSimulator
from tests.e2e.controlplane import ControlPlane, control_plane_for
from tests.e2e.system import GpuSharing, migrate
from timekeeper.chargeback.prices import load_price_sheet
from timekeeper.database.chargeback.prices import PriceLog
from timekeeper.database.connection import Database

LEASE_SECONDS = 2  # shorter than a pass over hundreds of pods: the controller must renew it while it works
METER_INTERVAL_SECONDS = 1.0
WEBHOOK_REFRESH_SECONDS = 2  # as a cluster would poll (the default is 5): a crossing takes the webhook a while to learn
CAPACITY_INTERVAL_SECONDS = 2  # the capacity ledger's passes (30 s by default): a node's outage is seen within a test
# The tier's price sheet (TIMEKEEPER_GPU_PRICES_FILE; docs/chargeback.md, "Prices"): A100 80 GB with a contracted
# price, T4 and H200 at their list prices; every other model unpriced.
PRICE_SHEET: dict[str, Any] = {"currency": "EUR", "prices": [
    {"model": "NVIDIA A100-SXM4-80GB", "from": "2026-01-01", "listPerGpuHour": "2.95", "contractedPerGpuHour": "2.137"},
    {"model": "Tesla T4", "from": "2026-01-01", "listPerGpuHour": "0.35"},
    {"model": "NVIDIA H200", "from": "2026-01-01", "listPerGpuHour": "4.106"},
]}
PRICES_RECORDED_BEFORE = dt.timedelta(hours=1)  # the sheet's history: see record_price_sheet_before


@pytest.fixture(scope="session")
def cluster_plane() -> Iterator[ControlPlane]:
    plane = control_plane_for("cluster tier", scheduler=True)
    yield plane
    plane.stop()


@pytest.fixture(scope="session")
def cluster(cluster_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuSharing]:
    """The project installed from the manifests, its webhook and a timekeeper on loopback, the tier's price sheet in
    force."""
    directory = tmp_path_factory.mktemp("cluster")
    prices = directory / "gpu-prices.yaml"
    prices.write_text(yaml.safe_dump(PRICE_SHEET, sort_keys=False))
    system = GpuSharing(cluster_plane, directory, webhook_threads=16,
                        timekeeper_env={"TIMEKEEPER_LEASE_SECONDS": str(LEASE_SECONDS),
                                        # Bills grow from the record every 2 s: budgets run out within a test.
                                        "TIMEKEEPER_BILLING_INTERVAL_SECONDS": "2",
                                        # The scale run's simulated meters report every 10 s: silent after two of those.
                                        "GPUSHARING_METER_INTERVAL_SECONDS": "10",
                                        "TIMEKEEPER_GPU_PRICES_FILE": str(prices),
                                        "TIMEKEEPER_CAPACITY_INTERVAL_SECONDS": str(CAPACITY_INTERVAL_SECONDS)},
                        webhook_env={"GPUSHARING_BUDGET_REFRESH_SECONDS": str(WEBHOOK_REFRESH_SECONDS)})
    record_price_sheet_before(system.database, prices)
    with system:
        yield system


def record_price_sheet_before(database: str, prices: Path) -> None:
    """The sheet at `prices` recorded in `database` (migrated) as a timekeeper started with it PRICES_RECORDED_BEFORE
    ago would have recorded it (timekeeper.database.chargeback.prices), so that it is in force from the hour under
    way: a sheet takes effect only at the first whole hour after it was recorded, and one recorded as the tier starts
    would price none of its hours. The timekeeper and its controller start with the same sheet and record nothing
    new; every clock is the real one."""
    migrate(database)
    db = Database(database)
    try:
        sheet = load_price_sheet(prices, shipped_catalogue())
        PriceLog(db).record(sheet, dt.datetime.now(dt.timezone.utc) - PRICES_RECORDED_BEFORE, str(prices))
    finally:
        db.engine.dispose()


@pytest.fixture(scope="session")
def nodes(cluster: GpuSharing, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeSimulator]:
    """The simulated kubelet of every simulated node (tests add their own pools); meters as each pod's annotation
    says."""
    simulator = NodeSimulator(cluster.plane, tmp_path_factory.mktemp("nodes"), timekeeper_url=cluster.timekeeper_url,
                              meter_interval=METER_INTERVAL_SECONDS).start()
    yield simulator
    simulator.stop()
