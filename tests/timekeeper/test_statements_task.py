"""The controller's `statements` task (timekeeper/cluster/statements.py) as the controller runs it, on SQLite and
PostgreSQL against an HTTP fake of the API: on only with a signing key; a day stated once it has closed, settled and
its GPU node has been counted past its end; what it did in its metrics."""

from __future__ import annotations

import datetime as dt

from demo.kubeapi import FakeKube
from gpusharing.contract import Period
from gpusharing.statements.note import generate_signer
from gpusharing.statements.verify import verify
from tests.timekeeper.conftest import Clock, ControllerFactory, run_controller
from tests.timekeeper.test_capacity_task import gpu_node
from timekeeper import metrics
from timekeeper.chargeback.calendar import BillingCalendar
from timekeeper.chargeback.statements import SigningKeys
from timekeeper.cluster.kube import KubeApi
from timekeeper.config import ChargebackSettings
from timekeeper.database.chargeback.statements import StatementLog

UTC = dt.timezone.utc
KEY = generate_signer("finance")
DAILY = BillingCalendar(Period.DAILY, dt.timedelta(minutes=30))


def test_without_a_signing_key_no_period_is_stated(make_controller: ControllerFactory, fake_kube: FakeKube) -> None:
    controller = make_controller(KubeApi(fake_kube.api_client()), chargeback=ChargebackSettings(DAILY))
    assert "statements" not in controller.scheduler.names
    assert run_controller(controller).statements is None


def test_a_day_is_stated_once_closed_settled_and_its_node_counted(
    make_controller: ControllerFactory, fake_kube: FakeKube, clock: Clock,
) -> None:
    fake_kube.custom["nodes"] = [gpu_node("gpu-1", "4", created=-600)]
    controller = make_controller(KubeApi(fake_kube.api_client()),
                                 chargeback=ChargebackSettings(DAILY, signing=SigningKeys(KEY)))
    assert "statements" in controller.scheduler.names
    midnight = dt.datetime(clock.at.year, clock.at.month, clock.at.day, tzinfo=UTC) + dt.timedelta(days=1)
    run_controller(controller)  # the node first counted
    clock.at = midnight + dt.timedelta(minutes=31) - dt.timedelta(seconds=1)
    assert getattr(run_controller(controller).statements, "periods", None) == 0  # not yet settled
    clock.at = midnight + dt.timedelta(minutes=31)
    done = run_controller(controller).statements
    assert done is not None and done.periods == 1
    assert metrics.STATED_UNTIL._value.get() == midnight.timestamp()  # type: ignore[attr-defined]
    log = StatementLog(controller.budget_sync.budgets.db)
    assert verify(log.stored(), [KEY.verifier]).ok
