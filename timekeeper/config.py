"""The timekeeper's settings, read once from TIMEKEEPER_* environment variables (documented in
docs/reference/settings.md)."""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from gpusharing.contract import DEFAULT_METER_INTERVAL_SECONDS, METER_INTERVAL_SETTING, Period
from gpusharing.gpu.catalogue import GpuCatalogue
from gpusharing.gpu.request import GpuRequestSettings
from gpusharing.idle.policy import IdlePolicy, IdlePolicyError, idle_policy_from_json
from gpusharing.settings.env import (
    ConfigError,
    env_choice,
    env_code,
    env_flag,
    env_float,
    env_int,
    env_list,
    env_text,
    env_url,
    refuse_retired,
)
from gpusharing.settings.gpu import gpu_request_settings
from gpusharing.settings.meter import meter_interval_seconds
from gpusharing.statements.note import NoteError, Signer
from gpusharing.units.duration import DurationError, parse_duration
from gpusharing.utilisation import UtilisationSource
from timekeeper.accounting.dcgm import DCGM_METRICS, DEFAULT_METRICS, DcgmQuery, check_label, check_selector
from timekeeper.chargeback.calendar import BILLING_PERIODS, MONTHLY, BillingCalendar
from timekeeper.chargeback.prices import NO_PRICES, PriceSheet, PriceSheetError, load_price_sheet
from timekeeper.chargeback.statements import SigningKeys
from timekeeper.fairshare.bands import FairShareBands

AUTH_MODES = ("tokenreview", "static", "none")
DEFAULT_CLOCK = "timekeeper.database.budgets.store:utc_now"
METRICS_AUTH = ("none", "token")
DEFAULT_DATABASE_URL = "sqlite:///timekeeper.sqlite"
# The node agent's ServiceAccount, in the namespace of its own the chart installs it in (its host access needs Pod
# Security's `privileged`, which the timekeeper's namespace does not allow).
DEFAULT_NODE_AGENT = "system:serviceaccount:gpusharing-node-agent:gpusharing-node-agent"
# Settings no longer read, and what to set instead: refused at start rather than silently ignored.
RETIRED_SETTINGS = {"TIMEKEEPER_METER_INTERVAL_SECONDS": METER_INTERVAL_SETTING}


@dataclass(frozen=True)
class TaskIntervals:
    """How often each of the controller's tasks runs (timekeeper.cluster.manager), in seconds."""

    budgets: float = 10.0  # resources into the ledger, crossings' Events and evictions; at once on a GPUBudget change
    statuses: float = 10.0  # GPUBudget and ClusterGPUBudget status
    bills: float = 30.0  # running pods' bills grow from the API server's record
    ended: float = 5.0  # ended pods' bills close and their finalizers come off
    idle: float = 10.0  # idle policies: an action comes within one run of its deadline
    silent_meters: float = 30.0  # MeterSilent Events
    commitments: float = 1.0  # safe admission's committed pods published for the web replicas
    events: float = 5.0  # the Event queue, besides whenever an Event is queued
    utilisation: float = 60.0  # GPU utilisation read from Prometheus (TIMEKEEPER_UTILISATION_SOURCE=prometheus)
    fairshare: float = 30.0  # fair share: bands ranked from decayed usage (when enabled)
    # the fair-share queue released into the GPUs free, room made past the grace; with fair share off, released whole
    fairshare_queue: float = 2.0
    capacity: float = 30.0  # the GPU capacity ledger: each GPU node's time since the last pass recorded
    statements: float = 60.0  # closed billing periods stated and signed (with TIMEKEEPER_STATEMENT_KEY_FILE)


TASK_SETTINGS = {
    "budgets": "TIMEKEEPER_DEMOTION_INTERVAL_SECONDS", "statuses": "TIMEKEEPER_STATUS_INTERVAL_SECONDS",
    "bills": "TIMEKEEPER_BILLING_INTERVAL_SECONDS", "ended": "TIMEKEEPER_ENDED_INTERVAL_SECONDS",
    "idle": "TIMEKEEPER_IDLE_INTERVAL_SECONDS", "silent_meters": "TIMEKEEPER_SILENT_METERS_INTERVAL_SECONDS",
    "commitments": "TIMEKEEPER_COMMITMENTS_INTERVAL_SECONDS", "utilisation": "TIMEKEEPER_UTILISATION_INTERVAL_SECONDS",
    "fairshare": "TIMEKEEPER_FAIRSHARE_INTERVAL_SECONDS",
    "fairshare_queue": "TIMEKEEPER_FAIRSHARE_QUEUE_INTERVAL_SECONDS",
    "capacity": "TIMEKEEPER_CAPACITY_INTERVAL_SECONDS",
    "statements": "TIMEKEEPER_STATEMENTS_INTERVAL_SECONDS",
}


def task_intervals(environ: Mapping[str, str]) -> TaskIntervals:
    defaults = TaskIntervals()
    return TaskIntervals(
        **{field: env_float(name, getattr(defaults, field), 0.1, environ) for field, name in TASK_SETTINGS.items()}
    )


# Where pods' GPU utilisation comes from besides the meters: meter, the meters' and node agents' reports alone;
# prometheus, DCGM's series read from Prometheus by the controller too.
UTILISATION_SOURCES = (UtilisationSource.METER.value, UtilisationSource.PROMETHEUS.value)


@dataclass(frozen=True)
class PrometheusSource:
    """The Prometheus that scrapes dcgm-exporter, and what to ask it (TIMEKEEPER_PROMETHEUS_*)."""

    url: str
    query: DcgmQuery = field(default_factory=DcgmQuery)
    ca_file: str | None = None  # its serving certificate's CA; None: the system's CAs
    token_file: str | None = None  # a bearer token that may query it, read at every query (projected tokens rotate)
    timeout_seconds: float = 10.0


def prometheus_source(environ: Mapping[str, str], interval_seconds: float) -> PrometheusSource:
    """TIMEKEEPER_PROMETHEUS_*, checked: label and metric names as PromQL takes them, a window no shorter than the
    task's interval (else the time between two windows is read by neither)."""
    names: dict[str, str] = {}  # the labels and the selector, as DcgmQuery takes them
    for key, name in (
        ("namespace_label", "TIMEKEEPER_PROMETHEUS_NAMESPACE_LABEL"),
        ("pod_label", "TIMEKEEPER_PROMETHEUS_POD_LABEL"),
        ("pod_uid_label", "TIMEKEEPER_PROMETHEUS_POD_UID_LABEL"),
        ("selector", "TIMEKEEPER_PROMETHEUS_SELECTOR"),
    ):
        value = environ.get(name, getattr(DcgmQuery, key)).strip()  # set empty: no UID label, no selector
        try:
            names[key] = (check_selector(value, name) if key == "selector" else
                          check_label(value, name) if value or key != "pod_uid_label" else "")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    metrics = env_list("TIMEKEEPER_PROMETHEUS_METRICS", DEFAULT_METRICS, environ)
    per_pod = environ.get("TIMEKEEPER_PROMETHEUS_PER_POD_METRIC", "").strip()
    if not metrics:
        raise ConfigError("TIMEKEEPER_PROMETHEUS_METRICS must name at least one metric")
    for metric in (*metrics, *filter(None, [per_pod])):
        if metric not in DCGM_METRICS:
            raise ConfigError(
                f"TIMEKEEPER_PROMETHEUS_METRICS and _PER_POD_METRIC: {metric!r} is not one of {', '.join(DCGM_METRICS)}"
            )
    window = env_int("TIMEKEEPER_PROMETHEUS_WINDOW_SECONDS", DcgmQuery.window_seconds, 10, environ)
    if not interval_seconds <= window <= 3600:
        raise ConfigError(
            f"TIMEKEEPER_PROMETHEUS_WINDOW_SECONDS={window} must be from TIMEKEEPER_UTILISATION_INTERVAL_SECONDS "
            f"({interval_seconds:g}) to 3600"
        )
    return PrometheusSource(
        url=str(env_url("TIMEKEEPER_PROMETHEUS_URL", environ=environ, required=True)),
        query=DcgmQuery(metrics=metrics, per_pod_metric=per_pod, window_seconds=window, **names),
        ca_file=environ.get("TIMEKEEPER_PROMETHEUS_CA_FILE", "").strip() or None,
        token_file=environ.get("TIMEKEEPER_PROMETHEUS_TOKEN_FILE", "").strip() or None,
        timeout_seconds=env_float("TIMEKEEPER_PROMETHEUS_TIMEOUT_SECONDS", 10.0, 0.1, environ),
    )


DEFAULT_BAND_CLASSES = ("gpusharing-in-budget-light", "gpusharing-in-budget", "gpusharing-in-budget-heavy")


@dataclass(frozen=True)
class FairShareSettings:
    """Fair share among namespaces in budget (docs/fair-share.md); off by default, and then nothing changes."""

    enabled: bool = False
    half_life: dt.timedelta = dt.timedelta(hours=24)  # usage decays by half in this time (a budget may set its own)
    bands: FairShareBands = FairShareBands(DEFAULT_BAND_CLASSES, (0.8, 1.25), 0.1, dt.timedelta(minutes=10))
    # pods of a higher band wait unschedulable this long before a rebalance
    grace: dt.timedelta = dt.timedelta(minutes=5)
    min_run_time: dt.timedelta = dt.timedelta(minutes=10)  # a pod runs at least this long before a rebalance evicts it


FAIRSHARE_SETTINGS = {
    "half_life": "TIMEKEEPER_FAIRSHARE_HALF_LIFE",
    "min_time_in_band": "TIMEKEEPER_FAIRSHARE_MIN_TIME_IN_BAND",
    "grace": "TIMEKEEPER_FAIRSHARE_GRACE",
    "min_run_time": "TIMEKEEPER_FAIRSHARE_MIN_RUN_TIME",
}


def fair_share_settings(environ: Mapping[str, str]) -> FairShareSettings:
    """TIMEKEEPER_FAIRSHARE_*: ConfigError naming the setting for anything out of bounds."""
    defaults = FairShareSettings()
    durations = {"half_life": defaults.half_life, "min_time_in_band": defaults.bands.min_time_in_band,
                 "grace": defaults.grace, "min_run_time": defaults.min_run_time}
    for key, name in FAIRSHARE_SETTINGS.items():
        raw = environ.get(name, "").strip()
        if raw:
            try:
                durations[key] = dt.timedelta(seconds=parse_duration(raw, name, 1.0 if key == "half_life" else 0.0))
            except DurationError as exc:
                raise ConfigError(str(exc)) from None
    classes = env_list("TIMEKEEPER_FAIRSHARE_CLASSES", DEFAULT_BAND_CLASSES, environ)
    raw_bounds = env_list("TIMEKEEPER_FAIRSHARE_RATIO_BOUNDS", tuple(map(str, defaults.bands.ratio_bounds)), environ)
    try:
        bounds = tuple(float(bound) for bound in raw_bounds)
    except ValueError:
        raise ConfigError(
            f"TIMEKEEPER_FAIRSHARE_RATIO_BOUNDS={','.join(raw_bounds)!r} must be numbers, e.g. 0.8,1.25"
        ) from None
    if not 2 <= len(classes) <= 8 or len(set(classes)) != len(classes):
        raise ConfigError("TIMEKEEPER_FAIRSHARE_CLASSES must name 2 to 8 distinct PriorityClasses, lightest first")
    if len(bounds) != len(classes) - 1 or any(not 0 < b < 1e6 for b in bounds) or list(bounds) != sorted(set(bounds)):
        raise ConfigError(f"TIMEKEEPER_FAIRSHARE_RATIO_BOUNDS must be {len(classes) - 1} increasing positive ratios "
                          "(one fewer than TIMEKEEPER_FAIRSHARE_CLASSES), e.g. 0.8,1.25")
    hysteresis = env_float("TIMEKEEPER_FAIRSHARE_HYSTERESIS", defaults.bands.hysteresis, 0.0, environ)
    if hysteresis >= 1:
        raise ConfigError("TIMEKEEPER_FAIRSHARE_HYSTERESIS is a relative margin below 1, e.g. 0.1")
    return FairShareSettings(
        enabled=env_flag("TIMEKEEPER_FAIRSHARE_ENABLED", False, environ),
        half_life=durations["half_life"],
        bands=FairShareBands(classes, bounds, hysteresis, durations["min_time_in_band"]),
        grace=durations["grace"],
        min_run_time=durations["min_run_time"],
    )


CLUSTER_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class ChargebackSettings:
    """How GPU time is booked for chargeback (docs/chargeback.md)."""

    calendar: BillingCalendar = MONTHLY  # TIMEKEEPER_BILLING_PERIOD, TIMEKEEPER_BILLING_GRACE
    share_unallocated: bool = False  # TIMEKEEPER_SHARE_UNALLOCATED: OpenCost's shareIdle
    cluster: str = "kubernetes"  # TIMEKEEPER_CLUSTER_NAME: the billing account exports name
    # TIMEKEEPER_STATEMENT_KEY_FILE (and _PREVIOUS_KEY_FILE): closed periods are stated and signed; None: not
    signing: SigningKeys | None = None


def chargeback_settings(environ: Mapping[str, str]) -> ChargebackSettings:
    """TIMEKEEPER_BILLING_PERIOD, TIMEKEEPER_BILLING_GRACE, TIMEKEEPER_SHARE_UNALLOCATED, TIMEKEEPER_CLUSTER_NAME,
    TIMEKEEPER_STATEMENT_KEY_FILE, TIMEKEEPER_STATEMENT_PREVIOUS_KEY_FILE."""
    period = Period(env_choice("TIMEKEEPER_BILLING_PERIOD", MONTHLY.period.value, BILLING_PERIODS, environ))
    raw_grace = environ.get("TIMEKEEPER_BILLING_GRACE", "").strip()
    try:
        grace = parse_duration(raw_grace, "TIMEKEEPER_BILLING_GRACE", 0.0, 7 * 24 * 3600.0) if raw_grace else None
    except DurationError as exc:
        raise ConfigError(str(exc)) from None
    cluster = env_text("TIMEKEEPER_CLUSTER_NAME", ChargebackSettings.cluster, environ)
    if not CLUSTER_NAME.fullmatch(cluster):
        raise ConfigError(f"TIMEKEEPER_CLUSTER_NAME={cluster!r} must be a DNS label (lower-case letters, digits, '-')")
    return ChargebackSettings(
        BillingCalendar(period, MONTHLY.grace if grace is None else dt.timedelta(seconds=grace)),
        env_flag("TIMEKEEPER_SHARE_UNALLOCATED", False, environ),
        cluster,
        signing_keys(environ),
    )


def signing_keys(environ: Mapping[str, str]) -> SigningKeys | None:
    """The statements' signing key (a C2SP signer key file, `gpusharing statements keygen`), and the previous one
    while the chain hands over to it; a previous key's path whose file is absent is none (the chart mounts both)."""
    path = environ.get("TIMEKEEPER_STATEMENT_KEY_FILE", "").strip()
    previous = environ.get("TIMEKEEPER_STATEMENT_PREVIOUS_KEY_FILE", "").strip()
    if not path and previous:
        raise ConfigError("TIMEKEEPER_STATEMENT_PREVIOUS_KEY_FILE is set without TIMEKEEPER_STATEMENT_KEY_FILE")
    current = _signer(Path(path), "TIMEKEEPER_STATEMENT_KEY_FILE") if path else None
    if current is None:
        return None
    return SigningKeys(current, _signer(Path(previous), "TIMEKEEPER_STATEMENT_PREVIOUS_KEY_FILE") if previous and
                       Path(previous).exists() else None)


def _signer(path: Path, name: str) -> Signer:
    try:
        if path.stat().st_size > 4096:
            raise ConfigError(f"{name}={path} is longer than a signing key (4096 bytes)")
        return Signer.from_text(path.read_text(encoding="utf-8").strip())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{name}={path} cannot be read: {exc}") from None
    except NoteError as exc:
        raise ConfigError(f"{name}={path} is not a signing key: {exc}") from None


# The most TIMEKEEPER_EVICTION_RETRY_SECONDS may be: a claim's retries end before another leader may take it over as
# stale (timekeeper.cluster.evictions.MAX_RETRY_SECONDS).
EVICTION_RETRY_LIMIT_SECONDS = 45.0


@dataclass(frozen=True)
class TimekeeperConfig:
    database_url: str = DEFAULT_DATABASE_URL
    auth: str = "tokenreview"
    static_tokens_file: str | None = None
    default_gpu_minutes: float | None = None  # budget of a namespace without one; None: unlimited
    default_period: Period = Period.MONTHLY
    default_idle: IdlePolicy | None = None  # the default budget's idle policy (TIMEKEEPER_IDLE_*); None: none
    # TIMEKEEPER_KUBECONFIG, else KUBECONFIG (a list, as kubectl reads it); None: in-cluster
    kubeconfig: str | None = None
    tasks: TaskIntervals = field(default_factory=TaskIntervals)  # the controller's tasks' intervals
    controller_port: int = 8081  # the controller's /livez, /readyz and /metrics (plain HTTP)
    # The meters' report interval, the one the webhook injects (GPUSHARING_METER_INTERVAL_SECONDS): a reading is fresh,
    # and a meter is silent after, gpusharing.contract.fresh_for of it.
    meter_interval_seconds: float = DEFAULT_METER_INTERVAL_SECONDS
    lease_namespace: str = "gpusharing-system"  # where the controller's Lease lives: the timekeeper's own namespace
    # Whose pod-bound tokens send node readings (POST /api/v1/node-readings); empty: the chart's node agent's
    # ServiceAccount (node_agents).
    node_agent_users: tuple[str, ...] = ()
    lease_seconds: float | None = None  # the controller's Lease; None: 3 budget passes, at least 15 s
    eviction_concurrency: int = 16  # evictions in flight at once: a real API server takes many
    eviction_retry_seconds: float = 30.0  # how long a pass asks again for an eviction answered 429
    auth_cache_seconds: float = 60.0  # TokenReview / SubjectAccessReview answers are reused this long
    reservation_seconds: float = 30.0  # how long safe admission's reservation waits for its pod in the pod watch
    auth_wait_seconds: float = 2.0  # a request waits this long for one, then gets a 503 (the answer kept for its retry)
    metrics_auth: str = "none"  # token: /metrics needs a token, as the budget listing does (it shows as much)
    db_pool_size: int = 10
    sqlite_busy_timeout_ms: int = 10_000
    db_statement_timeout_seconds: float = 30.0  # PostgreSQL cancels a statement (or its wait for a lock) after this
    host: str = "0.0.0.0"
    port: int = 8080
    workers: int = 2
    threads: int = 32  # request threads mostly wait for their report's transaction; more of them, bigger batches
    clock: str = DEFAULT_CLOCK  # module:function giving the time; TESTS ONLY change it, to move time across periods
    # the webhook's: pods are billed as admitted
    gpu_request: GpuRequestSettings = field(default_factory=GpuRequestSettings)
    catalogue_source: str = "the shipped catalogue"  # recorded in the weights' audit log
    price_sheet: PriceSheet = NO_PRICES  # TIMEKEEPER_GPU_PRICES_FILE: what a GPU-hour of each model costs
    price_sheet_source: str = "no price sheet"  # recorded with it
    prometheus: PrometheusSource | None = None  # TIMEKEEPER_UTILISATION_SOURCE=prometheus: where DCGM's series are read
    chargeback: ChargebackSettings = ChargebackSettings()

    @property
    def node_agents(self) -> frozenset[str]:
        """The usernames whose pod-bound tokens may send node readings."""
        return frozenset(self.node_agent_users or (DEFAULT_NODE_AGENT,))
    fair_share: FairShareSettings = field(default_factory=FairShareSettings)

    @property
    def catalogue(self) -> GpuCatalogue:
        """The GPU models and their billing weights."""
        return self.gpu_request.catalogue

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> TimekeeperConfig:
        refuse_retired(RETIRED_SETTINGS, environ)
        auth = env_choice("TIMEKEEPER_AUTH", cls.auth, AUTH_MODES, environ)
        tokens_file = environ.get("TIMEKEEPER_STATIC_TOKENS_FILE", "").strip() or None
        if auth == "static" and tokens_file is None:
            raise ConfigError("TIMEKEEPER_STATIC_TOKENS_FILE must be set when TIMEKEEPER_AUTH=static")
        raw_default = environ.get("TIMEKEEPER_DEFAULT_GPU_MINUTES", "").strip()
        tasks = task_intervals(environ)
        gpu_request = gpu_request_settings(environ)
        source = env_choice(
            "TIMEKEEPER_UTILISATION_SOURCE", UtilisationSource.METER.value, UTILISATION_SOURCES, environ
        )
        return cls(
            database_url=database_url(env_text("TIMEKEEPER_DATABASE_URL", DEFAULT_DATABASE_URL, environ)),
            auth=auth,
            static_tokens_file=tokens_file,
            default_gpu_minutes=env_float("TIMEKEEPER_DEFAULT_GPU_MINUTES", 0.0, 0.0, environ) if raw_default else None,
            default_period=Period(env_choice("TIMEKEEPER_DEFAULT_PERIOD", "monthly", tuple(Period), environ)),
            default_idle=default_idle_policy(environ),
            kubeconfig=environ.get("TIMEKEEPER_KUBECONFIG", "").strip()
            or environ.get("KUBECONFIG", "").strip()
            or None,
            tasks=tasks,
            controller_port=env_int("TIMEKEEPER_CONTROLLER_PORT", cls.controller_port, 1, environ),
            meter_interval_seconds=meter_interval_seconds(environ),
            lease_namespace=env_text("TIMEKEEPER_LEASE_NAMESPACE", cls.lease_namespace, environ),
            node_agent_users=tuple(
                user.strip() for user in environ.get("TIMEKEEPER_NODE_AGENT_USERS", "").split(",") if user.strip()
            ),
            lease_seconds=env_float("TIMEKEEPER_LEASE_SECONDS", 15.0, 1.0, environ)
            if environ.get("TIMEKEEPER_LEASE_SECONDS", "").strip()
            else None,
            eviction_concurrency=env_int("TIMEKEEPER_EVICTION_CONCURRENCY", cls.eviction_concurrency, 1, environ),
            eviction_retry_seconds=env_float(
                "TIMEKEEPER_EVICTION_RETRY_SECONDS",
                cls.eviction_retry_seconds,
                0.0,
                environ,
                EVICTION_RETRY_LIMIT_SECONDS,
            ),
            auth_cache_seconds=env_float("TIMEKEEPER_AUTH_CACHE_SECONDS", 60.0, 0.0, environ),
            reservation_seconds=env_float("TIMEKEEPER_RESERVATION_SECONDS", 30.0, 1.0, environ),
            auth_wait_seconds=env_float("TIMEKEEPER_AUTH_WAIT_SECONDS", 2.0, 0.1, environ),
            metrics_auth=env_choice("TIMEKEEPER_METRICS_AUTH", cls.metrics_auth, METRICS_AUTH, environ),
            db_pool_size=env_int("TIMEKEEPER_DB_POOL_SIZE", 10, 1, environ),
            sqlite_busy_timeout_ms=env_int("TIMEKEEPER_SQLITE_BUSY_TIMEOUT_MS", 10_000, 0, environ),
            db_statement_timeout_seconds=env_float("TIMEKEEPER_DB_STATEMENT_TIMEOUT_SECONDS", 30.0, 0.1, environ),
            host=env_text("TIMEKEEPER_HOST", cls.host, environ),
            port=env_int("TIMEKEEPER_PORT", cls.port, 1, environ),
            workers=env_int("TIMEKEEPER_WORKERS", cls.workers, 1, environ),
            threads=env_int("TIMEKEEPER_THREADS", cls.threads, 1, environ),
            clock=env_code("TIMEKEEPER_CLOCK", DEFAULT_CLOCK, environ),
            gpu_request=gpu_request,
            catalogue_source=environ.get("GPUSHARING_GPU_MODELS_FILE", "").strip()[:253] or cls.catalogue_source,
            price_sheet=price_sheet(environ, gpu_request.catalogue),
            price_sheet_source=environ.get("TIMEKEEPER_GPU_PRICES_FILE", "").strip()[:253] or cls.price_sheet_source,
            prometheus=prometheus_source(environ, tasks.utilisation)
            if source == UtilisationSource.PROMETHEUS
            else None,
            fair_share=fair_share_settings(environ),
            chargeback=chargeback_settings(environ),
        )


def price_sheet(environ: Mapping[str, str], catalogue: GpuCatalogue) -> PriceSheet:
    """TIMEKEEPER_GPU_PRICES_FILE's sheet, its models the catalogue's; no prices without one."""
    path = environ.get("TIMEKEEPER_GPU_PRICES_FILE", "").strip()
    if not path:
        return NO_PRICES
    try:
        return load_price_sheet(Path(path), catalogue)
    except PriceSheetError as exc:
        raise ConfigError(f"TIMEKEEPER_GPU_PRICES_FILE: {exc}") from None


IDLE_SETTINGS = {
    "after": "TIMEKEEPER_IDLE_AFTER",
    "action": "TIMEKEEPER_IDLE_ACTION",
    "warnBefore": "TIMEKEEPER_IDLE_WARN_BEFORE",
    "utilisationPercent": "TIMEKEEPER_IDLE_UTILISATION_PERCENT",
    "minAge": "TIMEKEEPER_IDLE_MIN_AGE",
}


def default_idle_policy(environ: Mapping[str, str]) -> IdlePolicy | None:
    """The default budget's idle policy, from TIMEKEEPER_IDLE_AFTER and the settings beside it; None when it is
    unset."""
    given = {key: environ[name].strip() for key, name in IDLE_SETTINGS.items() if environ.get(name, "").strip()}
    if "after" not in given:
        stray = [IDLE_SETTINGS[key] for key in given]
        if stray:
            raise ConfigError(
                f"{', '.join(stray)} set without TIMEKEEPER_IDLE_AFTER: set it (e.g. 4h) for a default idle policy"
            )
        return None
    if "utilisationPercent" in given:
        try:
            given["utilisationPercent"] = float(given["utilisationPercent"])  # type: ignore[assignment]
        except ValueError:
            raise ConfigError(
                f"TIMEKEEPER_IDLE_UTILISATION_PERCENT={given['utilisationPercent']!r} must be a number"
            ) from None
    try:
        return idle_policy_from_json(given, labels=IDLE_SETTINGS)
    except IdlePolicyError as exc:
        raise ConfigError(str(exc)) from None


DATABASE_URL_FORMS = "sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST:5432/DATABASE"


def database_url(raw: str, name: str = "TIMEKEEPER_DATABASE_URL") -> str:
    """The URL as SQLAlchemy takes it; postgres:// and postgresql:// (as providers print them) mean psycopg, the
    driver installed. ConfigError, without the password, for anything else."""
    try:
        url: URL = make_url(raw)
    except ArgumentError:
        raise ConfigError(f"{name} is not a database URL: use {DATABASE_URL_FORMS}") from None
    if url.drivername in ("postgres", "postgresql"):
        url = url.set(drivername="postgresql+psycopg")
    if url.drivername not in ("sqlite", "postgresql+psycopg"):
        shown = url.render_as_string(hide_password=True)
        raise ConfigError(f"{name}={shown}: the timekeeper speaks SQLite and PostgreSQL only: use {DATABASE_URL_FORMS}")
    return url.render_as_string(hide_password=False)
