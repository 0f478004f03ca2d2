"""The timekeeper's tables. Alembic migrations (migrations/) make and change them; these models describe them."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    BigInteger,
    Boolean,
    Date,
    Float,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpusharing.contract import AdmissionMode, Shortfall
from timekeeper.database.base import Base, UtcDateTime, table_of


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
    node: Mapped[str | None] = mapped_column(String(253))  # the node it was bound to, fixed with its model
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


class Charged:
    """A pod's charges, micro-GPU-seconds (timekeeper.database.accounting.usage.PodCharge)."""

    micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger)  # raw: share x time
    weighted_micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger)  # x the model's billing weight then
    metered_micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger)  # the part charged with a utilisation reading
    idle_micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger)  # of the metered part, what the GPU left idle
    idle_weighted_micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger, server_default="0")  # the same, billed


class PodUsageRow(Charged, Base):
    """A pod's charges per UTC day its GPU time was used in (the sums of its hours'): what usage reports sum."""

    __tablename__ = "pod_usage"

    pod_uid: Mapped[str] = mapped_column(String(253), primary_key=True)
    day: Mapped[dt.date] = mapped_column(Date, primary_key=True, index=True)
    model: Mapped[str] = mapped_column(String(96), primary_key=True)  # the catalogue's model it was billed as


class PodHourRow(Charged, Base):
    """A pod's charges split by the UTC hour its GPU time was used in (timekeeper.accounting.hours), exactly: what the
    capacity ledger and the FOCUS export read. `booked_hour` is `hour` for time charged while the hour's billing
    period was open, else the hour the charge was made in: a correction of a closed period (docs/chargeback.md)."""

    __tablename__ = "pod_hours"

    pod_uid: Mapped[str] = mapped_column(String(253), primary_key=True)
    hour: Mapped[dt.datetime] = mapped_column(UtcDateTime, primary_key=True, index=True)
    model: Mapped[str] = mapped_column(String(96), primary_key=True)
    booked_hour: Mapped[dt.datetime] = mapped_column(UtcDateTime, primary_key=True, index=True)


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


class ExportTagsRow(Base):
    """The tags a namespace's rows of a closed billing period were first exported with (its budget hierarchy then):
    every later export of the period writes them, so that moving a namespace to another team changes no closed
    export (timekeeper.database.chargeback.exports)."""

    __tablename__ = "export_tags"

    namespace: Mapped[str] = mapped_column(String(253), primary_key=True)
    period_start: Mapped[dt.datetime] = mapped_column(UtcDateTime, primary_key=True)
    tags: Mapped[str] = mapped_column(Text)  # JSON


class NodeHourRow(Base):
    """What a GPU node offered in one UTC hour, as the controller observed it (timekeeper.database.chargeback.capacity):
    its GPUs × the time it was there, and of that the time it was NotReady or gone, in micro-GPU-seconds."""

    __tablename__ = "node_hours"

    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    hour: Mapped[dt.datetime] = mapped_column(UtcDateTime, primary_key=True, index=True)
    model: Mapped[str] = mapped_column(String(96))  # its GPUs' model, as the biller reads it
    capacity_micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger)
    down_micro_gpu_seconds: Mapped[int] = mapped_column(BigInteger)


class NodeCapacityRow(Base):
    """Each GPU node's capacity observed so far: up to when, and as what, so that each second is recorded once."""

    __tablename__ = "node_capacity"

    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    uid: Mapped[str] = mapped_column(String(64))  # the Node's metadata.uid: a node re-created under its name is new
    model: Mapped[str] = mapped_column(String(96))
    micro_gpus: Mapped[int] = mapped_column(BigInteger)  # its GPUs (MIG slices as their fraction), in millionths
    ready: Mapped[bool] = mapped_column(Boolean)
    observed_until: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    gone_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)  # seen gone: nothing more is recorded


class StatementRow(Base):
    """A signed statement of a closed billing period, or of a key handover, in the chain's order
    (timekeeper.database.chargeback.statements; docs/audit.md). Written once, never updated."""

    __tablename__ = "statements"

    sequence: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)  # 1 for the first
    period_start: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, unique=True)  # None: a key handover
    period_end: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    tree_size: Mapped[int] = mapped_column(BigInteger)
    root: Mapped[bytes] = mapped_column(LargeBinary)  # SHA-256, RFC 6962's tree hash of the period's rows
    note: Mapped[bytes] = mapped_column(LargeBinary)  # the signed note, as verified
    leaf_hashes: Mapped[bytes | None] = mapped_column(LargeBinary)  # 32 bytes a leaf, in order: names a changed row
    signer: Mapped[str] = mapped_column(String(512))  # the verifier key in force from it on
    written_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


budgets = table_of(BudgetRow)
top_ups = table_of(TopUpRow)
budget_changes = table_of(BudgetChangeRow)
pod_ledgers = table_of(PodLedgerRow)
namespace_usage = table_of(NamespaceUsageRow)
namespace_period_usage = table_of(NamespacePeriodUsageRow)
namespace_states = table_of(NamespaceStateRow)
pod_usage = table_of(PodUsageRow)
pod_labels = table_of(PodLabelRow)
pod_hours = table_of(PodHourRow)
gpu_model_weights = table_of(GpuModelWeightRow)
budget_warnings = table_of(BudgetWarningRow)
reservations = table_of(ReservationRow)
idle_holds = table_of(IdleHoldRow)
controller_terms = table_of(ControllerTermRow)
eviction_claims = table_of(EvictionClaimRow)
webhook_listings = table_of(WebhookListingRow)
committed_pods = table_of(CommittedPodRow)
commitment_publications = table_of(CommitmentPublicationRow)
fair_share = table_of(FairShareRow)
gpu_price_sheets = table_of(GpuPriceSheetRow)
export_tags = table_of(ExportTagsRow)
node_hours = table_of(NodeHourRow)
node_capacity = table_of(NodeCapacityRow)
statements = table_of(StatementRow)
