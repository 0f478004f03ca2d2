"""Names the services agree on: the webhook's annotations, budget states, how the meter is wired, and the intervals
and bounds both sides of a conversation reckon by."""

from __future__ import annotations

from gpusharing.compat import StrEnum

ANNOTATION_PREFIX = "gpusharing.io/"
ANNOTATION_GPU_SHARE = "gpusharing.io/gpu-share"
ANNOTATION_DIALECT = "gpusharing.io/dialect"
ANNOTATION_BUDGET_STATE = "gpusharing.io/budget-state"
ANNOTATION_GPU_MEMORY = "gpusharing.io/gpu-memory-mib"  # GPU memory the pod asked for, all devices together
ANNOTATION_GPU_MODEL = "gpusharing.io/gpu-model"  # the catalogue's model the pod was read on: what it is billed as
# Under safe admission: the id of the webhook's reservation for the pod, by which the timekeeper's listing says it
# has counted the pod's commitment (and the webhook gives its local reservation up).
ANNOTATION_ADMISSION_ID = "gpusharing.io/admission-id"
# Safe admission's verdict on the pod (reserved, demoted, no-deadline, unchecked), for `gpusharing explain`.
ANNOTATION_SAFE_ADMISSION = "gpusharing.io/safe-admission"
# On a pod admitted out of budget because its owner is held (an idle pod of the owner's was evicted): the owner,
# KIND/NAME, for `gpusharing explain`.
ANNOTATION_IDLE_HOLD = "gpusharing.io/idle-hold"
# Fair share (docs/fair-share.md): the band's PriorityClass the pod was admitted in, and why, in one line.
ANNOTATION_FAIR_SHARE_BAND = "gpusharing.io/fair-share-band"
ANNOTATION_FAIR_SHARE_REASON = "gpusharing.io/fair-share-reason"
# The scheduling gate a GPU pod waits behind while fair share is on, until the controller releases it in fair-share
# order (Kueue's admission gate): only the controller may remove it (the chart's ValidatingAdmissionPolicy).
FAIR_SHARE_GATE = "gpusharing.io/fair-share"
# Labels under the prefix that are not the webhook's record but its users' word: a pod's author exempts the pod from
# idle policies (they stand, and may change).
IDLE_EXEMPT_LABEL = "gpusharing.io/idle-exempt"
TENANT_LABELS = frozenset((IDLE_EXEMPT_LABEL,))

# Everything the webhook writes under the prefix: on a GPU pod nothing else under it stands (annotations or labels),
# and a pod that asks for no GPU may carry nothing under it.
WEBHOOK_ANNOTATIONS = frozenset((
    ANNOTATION_GPU_SHARE, ANNOTATION_DIALECT, ANNOTATION_BUDGET_STATE, ANNOTATION_GPU_MEMORY, ANNOTATION_GPU_MODEL,
    ANNOTATION_ADMISSION_ID, ANNOTATION_SAFE_ADMISSION, ANNOTATION_IDLE_HOLD, ANNOTATION_FAIR_SHARE_BAND,
    ANNOTATION_FAIR_SHARE_REASON,
))

# The finalizer the webhook puts on every GPU pod it governs, which the timekeeper alone removes once the pod's bill
# is closed: a deleted pod stays until then, so the pod's end cannot escape its bill.
BILLING_FINALIZER = "gpusharing.io/billing"

# The audience of the projected ServiceAccount token the meter presents to the timekeeper.
TIMEKEEPER_TOKEN_AUDIENCE = "gpusharing-timekeeper"
# The audience of the token the API server may present to the webhook (its AdmissionConfiguration's kubeconfig).
WEBHOOK_TOKEN_AUDIENCE = "gpusharing-webhook"

# The header that carries a token to the timekeeper through the API server's service proxy, which consumes the
# Authorization header (the caller's credentials for the API server) and drops it before proxying.
TIMEKEEPER_TOKEN_HEADER = "X-Timekeeper-Authorization"


class BudgetState(StrEnum):
    IN_BUDGET = "in-budget"
    WARNING = "warning"  # in budget, above a warning threshold of its own or of an ancestor's budget
    OVER_BUDGET = "over-budget"
    UNLIMITED = "unlimited"  # the timekeeper's word for a namespace without a limit
    UNKNOWN = "unknown"  # the webhook's word for a namespace it has not heard of

    @property
    def demoted(self) -> bool:
        return self is BudgetState.OVER_BUDGET


class AdmissionMode(StrEnum):
    """How a budget admits GPU pods (Slurm's AccountingStorageEnforce=safe, per budget)."""

    OPEN = "open"  # by the budget's state alone
    SAFE = "safe"  # a pod with a deadline must fit in what is left uncommitted; a pod without one as under open
    STRICT = "strict"  # as safe, and a pod without a deadline is refused

    @property
    def checks_commitments(self) -> bool:
        return self is not AdmissionMode.OPEN


class Shortfall(StrEnum):
    """What safe admission does with a pod the uncommitted budget cannot cover."""

    DEMOTE = "demote"  # the over-budget priority class, as a namespace over budget gets
    REFUSE = "refuse"


class Period(StrEnum):
    """How often a budget renews: at UTC midnights, Mondays, first days of months, or never."""

    DAILY = "daily"
    WEEKLY = "weekly"  # ISO weeks: Monday 00:00 UTC to the next Monday
    MONTHLY = "monthly"
    NONE = "none"  # the budget never renews


class MeterEnv:
    """Environment variables the webhook gives the meter container (and the meter reads)."""

    NAMESPACE = "GPUSHARING_NAMESPACE"
    POD_NAME = "GPUSHARING_POD_NAME"
    POD_UID = "GPUSHARING_POD_UID"
    GPU_SHARE = "GPUSHARING_GPU_SHARE"
    GPU_MEMORY_MIB = "GPUSHARING_GPU_MEMORY_MIB"
    TIMEKEEPER_URL = "GPUSHARING_TIMEKEEPER_URL"
    TOKEN_PATH = "GPUSHARING_TOKEN_PATH"
    STATE_DIR = "GPUSHARING_METER_STATE_DIR"
    INTERVAL = "GPUSHARING_METER_INTERVAL"  # the webhook's METER_INTERVAL_SETTING, so the meter reports as billed


# The meter's report interval, in seconds: one setting, GPUSHARING_METER_INTERVAL_SECONDS, which the webhook gives
# every meter it injects (as MeterEnv.INTERVAL) and the timekeeper reckons by, so that both always agree. Below the
# minimum a meter would only be busy writing its state file; above the maximum two intervals of silence would outlast
# the quarter of an hour after which the timekeeper stops counting a pod it has not heard from as running.
METER_INTERVAL_SETTING = "GPUSHARING_METER_INTERVAL_SECONDS"
DEFAULT_METER_INTERVAL_SECONDS = 30.0
MIN_METER_INTERVAL_SECONDS = 0.05
MAX_METER_INTERVAL_SECONDS = 300.0
# How many meter intervals a reading stays fresh: one report may be late or lost, not two.
FRESH_INTERVALS = 2


def fresh_for(meter_interval_seconds: float) -> float:
    """How long a meter's reading stays fresh, in seconds: two meter intervals. An older reading tells nothing of how
    busy the pod's GPU is now (its utilisation is unknown), and a meter not heard from for longer is silent."""
    return FRESH_INTERVALS * meter_interval_seconds


# How often the webhook polls the timekeeper's budget listing (GPUSHARING_BUDGET_REFRESH_SECONDS, sent along as the
# poll's `refreshSeconds`), in seconds: the timekeeper refuses a poll outside these bounds, so the webhook refuses to
# start with a setting outside them.
DEFAULT_BUDGET_REFRESH_SECONDS = 5.0
MIN_BUDGET_REFRESH_SECONDS = 0.1
MAX_BUDGET_REFRESH_SECONDS = 3600.0

# Where the webhook mounts the meter's token and its state volume.
METER_TOKEN_DIR = "/var/run/secrets/gpusharing"
METER_TOKEN_FILE = "token"
METER_STATE_DIR = "/var/lib/gpusharing-meter"
