"""The timekeeper's tables. Alembic migrations (migrations/) make and change them; these models describe them."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    BigInteger,
    Boolean,
    Date,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    TypeDecorator,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from gpusharing.contract import AdmissionMode, Shortfall

UTC = dt.timezone.utc


class UtcDateTime(TypeDecorator[dt.datetime]):
    """Aware UTC datetimes on every backend (SQLite keeps no time zone, so one is put back on reading)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("UtcDateTime needs an aware datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_name)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class BudgetRow(Base):
    """A namespace's budget, or a group's (`namespace` then holds the group's name, e.g. team.vision)."""

    __tablename__ = "budgets"

    namespace: Mapped[str] = mapped_column(String(63), primary_key=True)
    gpu_minutes: Mapped[float | None] = mapped_column(Float)  # NULL: explicitly unlimited
    period: Mapped[str] = mapped_column(String(16))
    evict_on_exhaustion: Mapped[bool] = mapped_column(Boolean, default=False)
    parent: Mapped[str | None] = mapped_column(String(63))  # a group budget's name
    warning_thresholds: Mapped[str] = mapped_column(String(32))  # percents, comma-separated ("80,95"; "" for none)
    managed_by: Mapped[str | None] = mapped_column(String(253))  # "GPUBudget ns/name" or "ClusterGPUBudget name"
    admission: Mapped[str] = mapped_column(String(8), server_default=AdmissionMode.OPEN.value)  # an AdmissionMode
    on_shortfall: Mapped[str] = mapped_column(String(8), server_default=Shortfall.DEMOTE.value)  # a Shortfall
    idle: Mapped[str | None] = mapped_column(Text)  # its idle policy, JSON as the API gives it (gpusharing.idle.policy)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


class TopUpRow(Base):
    __tablename__ = "top_ups"
    # Statuses read the top-ups of the current periods by their starts: an equality lookup, whatever the history.
    __table_args__ = (Index("ix_top_ups_period_start", "period_start", "namespace"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    namespace: Mapped[str] = mapped_column(String(63), index=True)
    period_start: Mapped[dt.datetime] = mapped_column(UtcDateTime)  # the period the top-up adds to
    gpu_minutes: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(String(253))
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


class BudgetChangeRow(Base):
    """The audit log: every budget set, top-up and removal, who did it, and the status before and after."""

    __tablename__ = "budget_changes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    namespace: Mapped[str] = mapped_column(String(63), index=True)
    action: Mapped[str] = mapped_column(String(16))  # set | top-up | remove
    actor: Mapped[str] = mapped_column(String(253))
    changed_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    before: Mapped[str | None] = mapped_column(Text)  # JSON
    after: Mapped[str | None] = mapped_column(Text)  # JSON


class PodLedgerRow(Base):
    """A pod's bill: what the API server's record proves it held (observed) and what its meter reported (metered);
    `micro_gpu_seconds` is what was charged, the larger of the two (timekeeper.accounting.ledger)."""

    __tablename__ = "pod_ledgers"

    pod_uid: Mapped[str] = mapped_column(String(253), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(253), index=True)
    pod: Mapped[str] = mapped_column(String(253))
    billed_share: Mapped[float] = mapped_column(Float)
    # The catalogue's model it is billed on, fixed at its first charge (its node's once bound); its meter's is evidence.
    model: Mapped[str | None] = mapped_column(String(96))
    meter_model: Mapped[str | None] = mapped_column(String(96))  # the model its meter last named (NVML's)
    device_model: Mapped[str | None] = mapped_column(String(96))  # its GPUs' model, as its node agent last read it
    micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger)  # cumulative charged: max(observed, metered), never less
    metered_micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger, server_default="0")  # the meter's cumulative
    # the watch's, to observed_until
    observed_micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger, server_default="0")
    observed_until: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)  # the record is billed up to here
    started_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)  # the pod's status.startTime
    ended_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)  # its end as recorded: the bill is closed
    meter_silent_since: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)  # flagged silent (an Event) since
    last_seq: Mapped[int] = mapped_column(BigInteger)
    final: Mapped[bool] = mapped_column(Boolean, default=False)  # the meter's final report came
    first_report_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)  # None: its meter never reported
    last_report_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    gpu_memory_used_mib: Mapped[float | None] = mapped_column(Float)
    gpu_memory_requested_mib: Mapped[float | None] = mapped_column(Float)
    gpu_utilization_percent: Mapped[float | None] = mapped_column(Float)
    # Whose word gpu_utilization_percent (and gpu_memory_used_mib) is (gpusharing.utilisation.UtilisationSource: the
    # node agent's or Prometheus's outranks the meter's while fresh), when it was read, and until when it is fresh.
    utilisation_source: Mapped[str | None] = mapped_column(String(16))
    utilisation_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    utilisation_fresh_until: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    # Its idle streak (gpusharing.idle.verdict): since when every report read utilisation under the policy's
    # threshold (None: its last report was busy, or unknown), and when this streak was warned of and acted on.
    idle_since: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    idle_warned_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    idle_acted_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)


class NamespaceUsageRow(Base):
    """A namespace's charges per UTC day: every period is made of whole days, so any period's use is a sum.

    Weighted by the GPU models' billing weights (what budgets count); the raw GPU-seconds are in pod_usage.
    """

    __tablename__ = "namespace_usage"

    namespace: Mapped[str] = mapped_column(String(253), primary_key=True)
    day: Mapped[dt.date] = mapped_column(Date, primary_key=True)
    micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger)


class NamespacePeriodUsageRow(Base):
    """A namespace's charges per period of each kind (the rollups of namespace_usage, written with it in one
    transaction): a budget's use in its current period is one row, whatever the length of the history.

    Keyed by the period's first UTC day (1970-01-01 for the one period of `none`): periods are whole UTC days that no
    setting moves (timekeeper.budgets.periods), so a day's charges roll up into one period of each kind for good.
    The primary key leads with the period, so that the current periods of every namespace are one range each.
    """

    __tablename__ = "namespace_period_usage"
    __table_args__ = (PrimaryKeyConstraint("period", "period_start", "namespace"),)

    namespace: Mapped[str] = mapped_column(String(253))
    period: Mapped[str] = mapped_column(String(16))  # a Period's value
    period_start: Mapped[dt.date] = mapped_column(Date)
    micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger)


class PodUsageRow(Base):
    """A pod's charges per UTC day (the day they were received, as in namespace_usage): what usage reports sum."""

    __tablename__ = "pod_usage"

    pod_uid: Mapped[str] = mapped_column(String(253), primary_key=True)
    day: Mapped[dt.date] = mapped_column(Date, primary_key=True, index=True)
    model: Mapped[str] = mapped_column(String(96), primary_key=True)  # the catalogue's model it was billed as
    micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger)  # raw: share x time
    weighted_micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger)  # x the model's billing weight then
    metered_micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger)  # the part charged with a utilisation reading
    idle_micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger)  # of the metered part, what the GPU left idle
    idle_weighted_micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger, server_default="0")  # the same, billed


class PodLabelRow(Base):
    """The labels a pod had when the timekeeper first read it (bounded:
    timekeeper.database.accounting.usage.recorded_labels)."""

    __tablename__ = "pod_labels"

    pod_uid: Mapped[str] = mapped_column(String(253), primary_key=True)
    key: Mapped[str] = mapped_column(String(317), primary_key=True)
    value: Mapped[str] = mapped_column(String(63))


class GpuModelWeightRow(Base):
    """The audit log of billing weights: a row each time a model's weight takes effect (and for each model at first)."""

    __tablename__ = "gpu_model_weights"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(96))
    billing_weight: Mapped[int] = mapped_column(Integer)  # thousandths (gpusharing.units.weights)
    changed_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    source: Mapped[str] = mapped_column(String(253))  # the catalogue file it was read from


class GpuPriceSheetRow(Base):
    """The price sheets the timekeeper started with, each recorded once (timekeeper.chargeback.prices): a sheet is in
    force from `effective_at`, the first whole hour after it was recorded, until the next one's."""

    __tablename__ = "gpu_price_sheets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    recorded_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    effective_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, index=True)
    currency: Mapped[str | None] = mapped_column(String(3))  # ISO 4217; None: no sheet, nothing priced
    sheet: Mapped[str] = mapped_column(Text)  # its canonical JSON
    source: Mapped[str] = mapped_column(String(253))  # the file it was read from


class NamespaceStateRow(Base):
    """The last state the controller acted on (recorded an Event for), so each transition is acted on once."""

    __tablename__ = "namespace_states"

    namespace: Mapped[str] = mapped_column(String(253), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    changed_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


class BudgetWarningRow(Base):
    """The warning thresholds a budget reached in a period, each warned of once (an Event, a counter)."""

    __tablename__ = "budget_warnings"

    namespace: Mapped[str] = mapped_column(String(63), primary_key=True)
    period_start: Mapped[dt.datetime] = mapped_column(UtcDateTime, primary_key=True)
    threshold: Mapped[int] = mapped_column(Integer, primary_key=True)
    warned_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


class ReservationRow(Base):
    """Safe admission's reservation of a pod's commitment, until the timekeeper's pod watch sees the pod (or it
    lapses)."""

    __tablename__ = "reservations"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # the AdmissionReview's uid, on the pod too
    namespace: Mapped[str] = mapped_column(String(63))
    micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger)  # weighted
    expires_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, index=True)


class IdleHoldRow(Base):
    """An owner (ReplicaSet, StatefulSet, Job, ...) whose idle pod was evicted: its next pods are admitted out of
    budget until one of its pods uses its GPU again (timekeeper.cluster.idling)."""

    __tablename__ = "idle_holds"

    owner_uid: Mapped[str] = mapped_column(String(253), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(253), index=True)
    owner_kind: Mapped[str] = mapped_column(String(63))
    owner_name: Mapped[str] = mapped_column(String(253))
    pod: Mapped[str] = mapped_column(String(253))  # the pod evicted
    held_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


class ControllerTermRow(Base):
    """The controller's term: the Lease's leaseTransitions when its holder took it, recorded before it evicts anything
    (timekeeper.database.cluster.fencing). It only rises."""

    __tablename__ = "controller_terms"

    name: Mapped[str] = mapped_column(String(253), primary_key=True)  # the Lease's namespace/name
    term: Mapped[int] = mapped_column(BigInteger)
    holder: Mapped[str] = mapped_column(String(253))
    since: Mapped[float] = mapped_column(Float)  # the database's clock, seconds since the epoch


class EvictionClaimRow(Base):
    """A pod's eviction, claimed by the controller of a term before it asks the API server
    (timekeeper.database.cluster.fencing)."""

    __tablename__ = "eviction_claims"

    pod_uid: Mapped[str] = mapped_column(String(253), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(253))
    pod: Mapped[str] = mapped_column(String(253))
    term: Mapped[int] = mapped_column(BigInteger)
    claimed_at: Mapped[float] = mapped_column(Float, index=True)  # the database's clock, seconds since the epoch


class WebhookListingRow(Base):
    """Which budget listing each webhook process holds in force, as it said when it last polled
    (timekeeper.database.cluster.listings): a crossing's evictions wait until every live one holds a listing that shows
    it."""

    __tablename__ = "webhook_listings"

    webhook: Mapped[str] = mapped_column(String(253), primary_key=True)  # the process's own name for itself
    in_force_at: Mapped[float] = mapped_column(Float)  # the listing's listedAt (the database's clock); 0: none yet
    expires_at: Mapped[float] = mapped_column(Float, index=True)  # live until then: a few of its poll intervals


class CommittedPodRow(Base):
    """A GPU pod with a deadline that has not ended, as the controller last published it from its pod watch
    (timekeeper.database.cluster.commitments): what the web replicas count for safe admission. A pod that left the
    committed set (ended, deleted) stays a while, `gone_at` set, so that its admission id keeps its reservation given
    up."""

    __tablename__ = "committed_pods"

    uid: Mapped[str] = mapped_column(String(253), primary_key=True)  # the pod's metadata.uid
    namespace: Mapped[str] = mapped_column(String(253))
    name: Mapped[str] = mapped_column(String(253))
    share: Mapped[float] = mapped_column(Float)  # the billed share the webhook recorded
    weight: Mapped[int] = mapped_column(Integer)  # thousandths, of its GPU model
    deadline_seconds: Mapped[int] = mapped_column(Integer)  # its activeDeadlineSeconds, bounded
    started_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)  # None: not started (its whole deadline ahead)
    # gpusharing.io/admission-id: the reservation it replaces
    admission_id: Mapped[str | None] = mapped_column(String(64))
    seen_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)  # the database's time the controller last saw it change
    # the database's time it left the set; None: committed
    gone_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)


class CommitmentPublicationRow(Base):
    """The controller's heartbeat for committed_pods (one row): who last published, when, and whether its pod watch
    was healthy; `confirmed_at` is the last publication by a healthy watch, as of which the rows are the cluster's."""

    __tablename__ = "commitment_publications"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)  # "committed-pods"
    publisher: Mapped[str] = mapped_column(String(253))  # the publishing process's name for itself
    published_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)  # the database's time of its last publication
    healthy: Mapped[bool] = mapped_column(Boolean)  # whether its pod watch was healthy then
    # the last with a healthy watch; None: none yet
    confirmed_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)


class FairShareRow(Base):
    """A namespace's fair share (docs/fair-share.md): its usage decayed by a half-life, grown in the transaction that
    charges the ledger (timekeeper.database.accounting.pods), and its band as the controller's `fairshare` task last
    ranked it. Kept by namespace name, so that a namespace deleted and re-created finds its usage."""

    __tablename__ = "fair_share"

    namespace: Mapped[str] = mapped_column(String(253), primary_key=True)
    gpu_seconds: Mapped[float] = mapped_column(Float)  # model-weighted GPU-seconds, decayed to as_of
    as_of: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    # its budget's spec.fairShare.halfLife; None: the default
    half_life_seconds: Mapped[float | None] = mapped_column(Float)
    band: Mapped[int | None] = mapped_column(Integer)  # index into the bands' classes, 0 the top; None: not ranked yet
    band_since: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    reason: Mapped[str | None] = mapped_column(Text)  # the band's one-line reason
    ratio: Mapped[float | None] = mapped_column(Float)  # usage over share at the decisive level
    rank: Mapped[int | None] = mapped_column(Integer)  # among every namespace ranked, lightest 1
    share_gpus: Mapped[float | None] = mapped_column(Float)  # its fair share of the cluster's GPUs
    held_gpus: Mapped[float | None] = mapped_column(Float)  # GPUs its running pods held when ranked
    # JSON: its standing at each level (level, node, share, usage, ratio, rank)
    path: Mapped[str | None] = mapped_column(Text)
    band_changes_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)  # when its band would rise at zero use
    ranked_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)


def _table(row: type[Base]) -> Table:
    """A model's Table, typed as one (declarative types `__table__` as any FromClause)."""
    table = row.__table__
    assert isinstance(table, Table)
    return table


budgets = _table(BudgetRow)
top_ups = _table(TopUpRow)
budget_changes = _table(BudgetChangeRow)
pod_ledgers = _table(PodLedgerRow)
namespace_usage = _table(NamespaceUsageRow)
namespace_period_usage = _table(NamespacePeriodUsageRow)
namespace_states = _table(NamespaceStateRow)
pod_usage = _table(PodUsageRow)
pod_labels = _table(PodLabelRow)
gpu_model_weights = _table(GpuModelWeightRow)
gpu_price_sheets = _table(GpuPriceSheetRow)
budget_warnings = _table(BudgetWarningRow)
reservations = _table(ReservationRow)
idle_holds = _table(IdleHoldRow)
controller_terms = _table(ControllerTermRow)
eviction_claims = _table(EvictionClaimRow)
webhook_listings = _table(WebhookListingRow)
committed_pods = _table(CommittedPodRow)
commitment_publications = _table(CommitmentPublicationRow)
fair_share = _table(FairShareRow)
