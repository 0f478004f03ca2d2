"""Meter reports and the controller's observations charged to the pod ledgers and the namespaces' usage, exactly once,
a batch per transaction (the SQL side of timekeeper.accounting.ledger; docs/budgets.md, "Accounting").

Rows are locked in one order, ledgers by uid, then usage by namespace, then pods' daily usage by uid, so that
concurrent transactions cannot deadlock. Ledgers count raw GPU-seconds; usage grows by the charge weighted when made.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import bindparam, select

from gpusharing.contract import DEFAULT_METER_INTERVAL_SECONDS, fresh_for
from gpusharing.gpu.catalogue import GpuCatalogue, GpuModel, shipped_catalogue
from gpusharing.idle.verdict import Reading, Streak
from gpusharing.report import MAX_GPU_MODEL, MeterReport, ReportError
from gpusharing.units.weights import MICROS_PER_SECOND
from gpusharing.usage_report import Labels
from gpusharing.utilisation import UtilisationSource
from timekeeper.accounting.hours import charge_hours
from timekeeper.accounting.ledger import (
    NEW_POD,
    Accounting,
    Observation,
    Outcome,
    PodLedger,
    billed_micro_gpu_seconds,
    close,
    meter_ceiling,
    observe,
    report,
)
from timekeeper.budgets.periods import period_starts, usage_day
from timekeeper.budgets.status import BudgetStatus, crossed
from timekeeper.chargeback.calendar import MONTHLY, BillingCalendar
from timekeeper.chargeback.prices import NO_PRICES, PriceSheet
from timekeeper.database.accounting.fairshare import Charge, FairShareLedger, charged_interval
from timekeeper.database.accounting.pods import (
    _ADVANCING_COLUMNS,
    _OBSERVING_COLUMNS,
    _OPENING_COLUMNS,
    _READING_COLUMNS,
    LOCKED_COLUMNS,
    PodLedgers,
    _ledger_columns,
    ledger_reading,
    reading_columns,
    streak_columns,
)
from timekeeper.database.accounting.terms import BillingTerms
from timekeeper.database.accounting.thresholds import IdleThresholds
from timekeeper.database.accounting.usage import SpreadCharge, UsageLedger, pod_charge
from timekeeper.database.budgets.store import BudgetStore
from timekeeper.database.connection import Statements
from timekeeper.database.tables import namespace_period_usage, namespace_usage, pod_ledgers


@dataclass(frozen=True)
class ReportTerms:
    """What the webhook recorded on the reporting pod, trusted in place of what the report claims."""

    share: float
    requested_memory_mib: float | None  # None: the pod's request of GPU memory is not known
    labels: Labels = ()  # the pod's, as usage reports may group by them
    model: str | None = None  # the GPU model the webhook recorded on the pod
    started_at: dt.datetime | None = None  # the pod's status.startTime: what its meter may claim runs from there
    node: str | None = None  # the node it is bound to


@dataclass(frozen=True)
class ReportResult:
    outcome: Outcome
    charged_micro_gpu_seconds: int  # raw
    billed_micro_gpu_seconds: int  # weighted: what the budget counted
    status: BudgetStatus  # the namespace's, after the report
    crossed: bool  # this report moved the namespace's state, or past a warning threshold

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.status.namespace,
            "state": str(self.status.state),
            "outcome": str(self.outcome),
            "chargedGpuSeconds": self.charged_micro_gpu_seconds / MICROS_PER_SECOND,
            "billedGpuSeconds": self.billed_micro_gpu_seconds / MICROS_PER_SECOND,
        }


@dataclass(frozen=True)
class PodObservation:
    """A pod as the API server records it, for a controller pass to bill (observation None: gone from the record, its
    bill closes as last observed)."""

    pod_uid: str
    namespace: str
    pod: str
    share: float
    observation: Observation | None
    labels: Labels = ()
    model: str | None = None  # the GPU model its spec was read as
    node: str | None = None  # the node it is bound to


@dataclass(frozen=True)
class _Entry:
    """One report or observation, checked before the transaction, to account against its pod's ledger."""

    index: int  # its place in the batch
    pod_uid: str
    namespace: str
    pod: str
    labels: Labels
    model: GpuModel  # billed as
    node: str | None  # bound to
    utilization_percent: float | None  # for the idle part of its charge
    apply: Callable[[PodLedger, dt.datetime], Accounting]
    written: dict[str, Any]  # the columns it sets besides the accounting (when it charges)
    opening: dict[str, Any]  # and those of a ledger it opens
    observed: bool = False  # an observation: its idle part is read from the meter's latest reading, if recent


@dataclass
class _Locked:
    """A pod's ledger row as a transaction locked it, and as the batch's reports and observations move it."""

    namespace: str
    ledger: PodLedger
    reading: Reading  # the latest utilisation reading, whoever's: the idle part of what is charged while it is fresh
    memory_used_mib: float | None  # read with it
    streak: Streak


class ReportLedger(PodLedgers):
    """Charges meter reports and the controller's observations to the pod ledgers, exactly once."""

    def __init__(
        self, budgets: BudgetStore, stale_seconds: float = 900.0,
        catalogue: GpuCatalogue | None = None, catalogue_source: str = "the shipped catalogue",
        meter_interval_seconds: float = DEFAULT_METER_INTERVAL_SECONDS, policy_refresh_seconds: float = 30.0,
        fair_share: FairShareLedger | None = None, prices: PriceSheet = NO_PRICES,
        prices_source: str = "no price sheet", calendar: BillingCalendar = MONTHLY,
    ):
        super().__init__(budgets.db, budgets.clock, stale_seconds)
        self.budgets = budgets
        self.fair_share = fair_share  # None: fair share is off, and no decayed usage is kept
        self.catalogue = catalogue or shipped_catalogue()
        self.terms = BillingTerms(self.db, self.catalogue, catalogue_source, prices, prices_source)
        # The contract's one rule: a meter's reading this recent tells how busy an observed interval was, and a longer
        # silence between two reports (a silent meter) ends an idle streak.
        self.fresh_seconds = fresh_for(meter_interval_seconds)
        self.idle_threshold = IdleThresholds(budgets, policy_refresh_seconds)
        self.usage = UsageLedger(self.db, calendar)
        # Built once: constructing statements per report would cost more than running them.
        lock = (
            select(*(pod_ledgers.c[column] for column in LOCKED_COLUMNS))
            .where(pod_ledgers.c.pod_uid.in_(bindparam("uids", expanding=True)))
            .order_by(pod_ledgers.c.pod_uid)
        )
        self._lock = lock if self.db.is_sqlite else lock.with_for_update()
        self._open = self.db.bulk_insert(pod_ledgers, _OPENING_COLUMNS, lambda insert: insert.on_conflict_do_nothing())
        self._advance = self.db.bulk_update(pod_ledgers, "pod_uid", _ADVANCING_COLUMNS)
        self._observed = self.db.bulk_update(pod_ledgers, "pod_uid", _OBSERVING_COLUMNS)
        self._charge = self.db.bulk_insert(
            namespace_usage,
            ["namespace", "day", "micro_gpu_seconds"],
            lambda insert: insert.on_conflict_do_update(
                index_elements=[namespace_usage.c.namespace, namespace_usage.c.day],
                set_={"micro_gpu_seconds": namespace_usage.c.micro_gpu_seconds + insert.excluded.micro_gpu_seconds},
            ),
        )
        self._roll_up = self.db.bulk_insert(
            namespace_period_usage,
            ["namespace", "period", "period_start", "micro_gpu_seconds"],
            lambda insert: insert.on_conflict_do_update(
                index_elements=[
                    namespace_period_usage.c.period,
                    namespace_period_usage.c.period_start,
                    namespace_period_usage.c.namespace,
                ],
                set_={
                    "micro_gpu_seconds": namespace_period_usage.c.micro_gpu_seconds + insert.excluded.micro_gpu_seconds
                },
            ),
        )

    def record(self, reports: Sequence[tuple[MeterReport, ReportTerms | None]]) -> list[ReportResult | ReportError]:
        """Accounts meter reports, in order, in one transaction (terms None: the report's own share and request are
        trusted, as off a cluster); each gets its result, or the ReportError that refused it and changed nothing."""
        now = self._now()
        results: dict[int, ReportResult | ReportError] = {}
        entries: list[_Entry] = []
        for index, (meter_report, terms) in enumerate(reports):
            try:
                cumulative = billed_micro_gpu_seconds(meter_report, None if terms is None else terms.share)
            except ReportError as refused:
                results[index] = refused
                continue
            entries.append(self._report_entry(index, meter_report, terms, cumulative, now))
        if entries:
            results.update(self._account(entries, now))
        return [results[index] for index in range(len(reports))]

    def observe(self, observations: Sequence[PodObservation]) -> list[ReportResult]:
        """Accounts what the API server records of pods (a controller pass's), in one transaction."""
        now = self._now()
        entries = [self._observation_entry(index, observed) for index, observed in enumerate(observations)]
        results = self._account(entries, now) if entries else {}
        return [result for _, result in sorted(results.items()) if isinstance(result, ReportResult)]

    def _now(self) -> dt.datetime:
        now = self.budgets.clock()
        self.terms.record_once(now)
        return now

    def _report_entry(
        self, index: int, meter_report: MeterReport, terms: ReportTerms | None, cumulative: int, now: dt.datetime
    ) -> _Entry:
        share = meter_report.gpu_share if terms is None else terms.share
        meter_model = self._model_named(meter_report.gpu_model)
        named = meter_model.name if meter_model else meter_report.gpu_model  # evidence: kept, compared, never billed
        readings = _readings(meter_report, terms, now, self.fresh_seconds, named)

        def apply(ledger: PodLedger, at: dt.datetime) -> Accounting:
            if ledger.started_at is None and terms is not None and terms.started_at is not None:
                ledger = replace(ledger, started_at=terms.started_at)
            ceiling = meter_ceiling(ledger, share, at)
            return report(ledger, meter_report.seq, cumulative, meter_report.final, ceiling, share)

        return _Entry(
            index,
            meter_report.pod_uid,
            meter_report.namespace,
            meter_report.pod,
            () if terms is None else terms.labels,
            # Off a cluster the meter's word is all there is; on one, the model of the pod's node (ReportTerms).
            (meter_model if terms is None else self._model_named(terms.model)) or self.catalogue.default,
            None if terms is None else terms.node,
            meter_report.gpu_utilization_percent,
            apply,
            {**readings, "meter_silent_since": None},
            {**readings, "first_report_at": now, "started_at": None if terms is None else terms.started_at},
        )

    def _observation_entry(self, index: int, observed: PodObservation) -> _Entry:
        observation = observed.observation

        def apply(ledger: PodLedger, at: dt.datetime) -> Accounting:
            return close(ledger, at) if observation is None else observe(ledger, observation)

        return _Entry(
            index, observed.pod_uid, observed.namespace, observed.pod, observed.labels,
            self._model_named(observed.model) or self.catalogue.default, observed.node, None, apply,
            {},
            {**dict.fromkeys(_READING_COLUMNS), "first_report_at": None,
             "started_at": None if observation is None else observation.started_at},
            observed=True,
        )

    def _account(self, entries: list[_Entry], now: dt.datetime) -> dict[int, ReportResult | ReportError]:
        """One transaction in two round trips on PostgreSQL: the ledgers are read and locked, then all is written."""
        results: dict[int, ReportResult | ReportError] = {}
        accounted: dict[int, tuple[str, Accounting]] = {}
        advanced: dict[str, dict[str, Any]] = {}
        charges: dict[str, int] = defaultdict(int)
        spread: list[SpreadCharge] = []
        billed: dict[int, int] = {}
        decayed: list[Charge] = []
        # Read before the transaction, so that nothing waits on it while the ledgers are locked.
        thresholds = {
            ns: self.idle_threshold(ns) for ns in {entry.namespace for entry in entries if not entry.observed}
        }
        with self.db.pipeline() as conn:
            # The budgets travel with the lock; they are needed after the charges.
            budget_rows = self.budgets.budget_rows(conn, {entry.namespace for entry in entries})
            ledgers = self._lock_ledgers(conn, entries, now)
            for entry in entries:
                locked = ledgers[entry.pod_uid]
                namespace = locked.namespace
                if namespace != entry.namespace:
                    results[entry.index] = ReportError(
                        f"pod {entry.pod_uid} reports in namespace {namespace}, not {entry.namespace}"
                    )
                    continue
                model = self._pinned(locked.ledger.model, entry.model)
                before, node = locked.ledger, locked.ledger.node or entry.node
                if before.model != model.name or before.node != node:  # else replace() would copy it as it is
                    before = replace(before, model=model.name, node=node)
                accounting = entry.apply(before, now)
                locked.ledger = accounting.ledger
                accounted[entry.index] = (namespace, accounting)
                # The meter's reading counts only where no fresher word of a higher rank (the node's) stands.
                heard = not entry.observed and not locked.reading.outranks(UtilisationSource.METER, now)
                utilization = entry.utilization_percent if heard else (
                    locked.reading.utilisation if locked.reading.fresh(now, self.fresh_seconds) else None)
                charge = pod_charge(accounting.charge_micro_gpu_seconds, model.billing_weight, utilization)
                after = accounting.ledger
                hours = charge_hours(before.billed, after.billed, after.started_at, after.share, now)
                spread.append(SpreadCharge(entry.pod_uid, model.name, charge, hours))
                charges[namespace] += charge.weighted_micro_gpu_seconds
                billed[entry.index] = charge.weighted_micro_gpu_seconds
                if self.fair_share is not None and charge.weighted_micro_gpu_seconds > 0:  # not a correction
                    decayed.append(
                        charged_interval(namespace, accounting, charge.weighted_micro_gpu_seconds, now, entry.observed)
                    )
                if accounting.outcome is Outcome.CHARGED:
                    advanced[entry.pod_uid] = {
                        **advanced.get(entry.pod_uid, {}),
                        "pod_uid": entry.pod_uid,
                        "pod": entry.pod,
                        **_ledger_columns(accounting.ledger),
                        **entry.written,
                        **(
                            {}
                            if entry.observed
                            else self._reading_columns(locked, entry, heard, thresholds[namespace], now)
                        ),
                    }
            if advanced:  # a batch is all reports or all observations, which write different columns
                write = self._observed if entries[0].observed else self._advance
                write.execute(conn, [advanced[uid] for uid in sorted(advanced)])
            day = usage_day(now)
            charged = [
                {"namespace": ns, "day": day, "micro_gpu_seconds": charges[ns]} for ns in sorted(charges) if charges[ns]
            ]
            if charged:
                self._charge.execute(conn, charged)
                self._roll_up.execute(conn, rolled_up(charged))
            self.usage.charge(conn, spread, now)
            if self.fair_share is not None:  # with the charges, so that decayed usage counts each exactly once
                self.fair_share.grow(conn, decayed)
            # Read after the charges, in the same transaction; sent with them and the commit.
            reads = self.budgets.read_use(conn, budget_rows, charges.keys(), now) if charges else None
        statuses = reads.statuses() if reads else {}
        earlier = reads.statuses(minus=charges) if reads else {}
        crossings = {namespace: crossed(earlier[namespace], status) for namespace, status in statuses.items()}
        for index, (namespace, accounting) in accounted.items():
            results[index] = ReportResult(
                accounting.outcome,
                accounting.charge_micro_gpu_seconds,
                billed[index],
                statuses[namespace],
                crossings[namespace],
            )
        return results

    def _model_named(self, name: str | None) -> GpuModel | None:
        """The catalogue's model of that name (NVML's, or as recorded); None for no name or one it does not have."""
        return self.catalogue.by_name(name[:MAX_GPU_MODEL]) if name else None

    def _pinned(self, pinned: str | None, model: GpuModel) -> GpuModel:
        """The model a pod is billed on: the one its ledger fixed at its first charge, else `model` (fixed now); a
        fixed model the catalogue no longer has is billed at the default's weight, under its own name."""
        if pinned is None or pinned == model.name:
            return model
        return self.catalogue.by_name(pinned) or replace(self.catalogue.default, name=pinned)

    def _reading_columns(self, locked: _Locked, entry: _Entry, heard: bool, threshold: float,
                         now: dt.datetime) -> dict[str, Any]:
        """The pod's reading and idle streak (gpusharing.idle.verdict) after an accepted report, as its ledger keeps
        them: moved by the meter's reading when it is heard, else (the node's word stands) left as they were."""
        if heard:
            locked.streak = locked.reading.next_streak(
                locked.streak, UtilisationSource.METER, entry.utilization_percent, threshold, now, self.fresh_seconds
            )
            locked.reading = Reading(entry.utilization_percent, now, UtilisationSource.METER,
                                     now + dt.timedelta(seconds=self.fresh_seconds))
            locked.memory_used_mib = entry.written["gpu_memory_used_mib"]
        return {**reading_columns(locked.reading, locked.memory_used_mib), **streak_columns(locked.streak)}

    def _lock_ledgers(self, conn: Statements, entries: list[_Entry], now: dt.datetime) -> dict[str, _Locked]:
        """Every pod of the batch's ledger row, locked; pods seen for the first time get a ledger."""
        uids = sorted({entry.pod_uid for entry in entries})
        rows = {row.pod_uid: row for row in conn.execute(self._lock, {"uids": uids})}
        new = {}
        labels: dict[str, Labels] = {}
        for entry in entries:
            if entry.pod_uid not in rows and entry.pod_uid not in new:
                new[entry.pod_uid] = {
                    "pod_uid": entry.pod_uid,
                    "namespace": entry.namespace,
                    "pod": entry.pod,
                    **_ledger_columns(NEW_POD),
                    **entry.opening,
                }
                labels[entry.pod_uid] = entry.labels
        if new:
            # Another transaction may open the same pod at once: one insert wins, and both lock the winner's row.
            self._open.execute(conn, [new[uid] for uid in sorted(new)])
            self.usage.label(conn, labels)
            rows.update((row.pod_uid, row) for row in conn.execute(self._lock, {"uids": sorted(new)}))
        return {
            uid: _Locked(
                row.namespace,
                PodLedger(
                    row.last_seq,
                    row.metered_micro_gpu_seconds,
                    row.observed_micro_gpu_seconds,
                    row.micro_gpu_seconds,
                    row.final,
                    row.started_at,
                    row.observed_until,
                    row.ended_at,
                    row.billed_share or None,
                    row.model,
                    row.node,
                ),
                ledger_reading(
                    row.gpu_utilization_percent, row.utilisation_source, row.utilisation_at, row.utilisation_fresh_until
                ),
                row.gpu_memory_used_mib,
                Streak(row.idle_since, row.idle_warned_at, row.idle_acted_at),
            )
            for uid, row in rows.items()
        }


def rolled_up(charged: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rollup rows of daily charges (namespace_usage's rows): each day's charge added to the period of each kind
    it lies in, in namespace order as the day rows are (rows are locked in one order)."""
    starts = {day: period_starts(day) for day in {row["day"] for row in charged}}  # a batch's charges share one day
    return [
        {
            "namespace": row["namespace"],
            "period": kind.value,
            "period_start": start,
            "micro_gpu_seconds": row["micro_gpu_seconds"],
        }
        for row in charged
        for kind, start in starts[row["day"]].items()
    ]


def _readings(report: MeterReport, terms: ReportTerms | None, now: dt.datetime, fresh_seconds: float,
              meter_model: str | None) -> dict[str, Any]:
    """What a charged report leaves in its pod's ledger besides the accounting: its NVML readings (a ledger it opens
    takes them; an open ledger's move only where no higher word stands, `ReportLedger._reading_columns`)."""
    reading = Reading(
        report.gpu_utilization_percent, now, UtilisationSource.METER, now + dt.timedelta(seconds=fresh_seconds)
    )
    return {
        **reading_columns(reading, report.gpu_memory_used_mib),
        "gpu_memory_requested_mib": report.gpu_memory_requested_mib if terms is None else terms.requested_memory_mib,
        "last_report_at": now,
        "meter_model": meter_model,
    }
