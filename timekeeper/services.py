"""The timekeeper's services, built once per process from its settings: what the API's blueprints call, and what
stops on SIGTERM. Nothing here knows HTTP."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

from gpusharing.clock import Clock, ReadClock
from gpusharing.kube.client import in_cluster_available
from gpusharing.listing import BudgetListing, FairShareListing, FairShareStanding, ListedBudget
from gpusharing.settings.env import ConfigError, load_code
from timekeeper import metrics
from timekeeper.auth import Authenticator, StaticTokens, load_static_tokens
from timekeeper.budgets.commitments import NOT_KNOWN, listed_commitments
from timekeeper.budgets.status import BudgetStatus, default_budget
from timekeeper.config import DEFAULT_CLOCK, TimekeeperConfig
from timekeeper.database.accounting.charging import ReportLedger
from timekeeper.database.accounting.fairshare import FairShareLedger, listed_band
from timekeeper.database.accounting.readings import UtilisationLedger
from timekeeper.database.accounting.report_queue import ReportQueue
from timekeeper.database.accounting.streaks import IdleLedger, holds_by_namespace
from timekeeper.database.budgets.reservations import ReservationStore
from timekeeper.database.budgets.store import BudgetStore
from timekeeper.database.chargeback.capacity import CapacityLedger
from timekeeper.database.clock import DatabaseClock
from timekeeper.database.cluster.commitments import PublishedCommitments
from timekeeper.database.cluster.listings import WebhookListings
from timekeeper.database.connection import Database
from timekeeper.database.schema import head_revision

if TYPE_CHECKING:
    from timekeeper.cluster.kube import KubeApi

log = logging.getLogger(__name__)

NO_AUTH_WARNING = (
    "TIMEKEEPER_AUTH=none: ANYONE who can reach this timekeeper can change budgets and report usage. "
    "Use it for a local demo only."
)
OFF_CLUSTER = (
    "TIMEKEEPER_AUTH=tokenreview checks tokens with the Kubernetes API, and there is no in-cluster ServiceAccount "
    "here: set KUBECONFIG (or TIMEKEEPER_KUBECONFIG), or off-cluster TIMEKEEPER_AUTH=static with "
    "TIMEKEEPER_STATIC_TOKENS_FILE (TIMEKEEPER_AUTH=none for a local demo)"
)


@dataclass
class Services:
    config: TimekeeperConfig
    auth: Authenticator
    database: Database
    budgets: BudgetStore
    reservations: ReservationStore
    ledger: ReportLedger
    idle: IdleLedger
    reports: ReportQueue
    utilisation: UtilisationLedger  # the node agents' readings (and Prometheus's, through the same call)
    commitments: PublishedCommitments  # the committed pods the controller publishes (this process watches no pods)
    collector: metrics.LedgerCollector
    schema_head: str
    webhooks: WebhookListings  # what each webhook process holds in force
    fair_share: FairShareLedger | None = None  # None: fair share is off

    def listing(self, listed_at: float) -> BudgetListing:
        """The budget listing (`GET /api/v1/budgets`), read at `listed_at`: every status, the default budget, fair
        share's classes."""
        store = self.budgets
        items = tuple(self.listed(store.statuses()))
        return BudgetListing(items, default_budget(store.default_gpu_minutes, store.default_period), listed_at,
                             self.fair_share_listing())

    def listed(self, statuses: list[BudgetStatus], detail: bool = False) -> list[ListedBudget]:
        """Statuses as the API answers them, with their commitments (a group's count the pods of all the namespaces
        below it), a namespace's owners held out of budget after an idle pod of theirs was evicted, and its fair-share
        band (`detail`: with its path). Where the listing's entries are built, for the listing and a budget read
        alone."""
        pods = self.commitments.read()
        committed = pods.by_namespace()
        held_idle = holds_by_namespace(self.idle.holds())
        if committed is None:
            counted = listed_commitments(statuses, None, {}, {})
        else:
            held = self.reservations.held(pods.counted_ids())
            counted = listed_commitments(statuses, committed, self.budgets.budgets() if committed or held else {}, held)
        bands = self.fair_share_bands((status.namespace for status in statuses), detail)
        listed = []
        for status in statuses:
            commitments = counted.get(status.namespace, NOT_KNOWN)
            holds = [hold.listed() for hold in held_idle.get(status.namespace, [])]
            listed.append(status.listed(commitments.committed_gpu_minutes, commitments.uncommitted, holds,
                                        bands.get(status.namespace)))
        return listed

    def fair_share_bands(self, namespaces: Iterable[str], detail: bool = False) -> dict[str, FairShareStanding]:
        """The band of each ranked namespace as the webhook admits by it (none when fair share is off); `detail`: with
        its path and when its band would rise at zero use (timekeeper.database.accounting.fairshare.listed_band)."""
        if self.fair_share is None:
            return {}
        settings = self.config.fair_share
        ledger = self.fair_share
        return {name: band for name, record in ledger.records(set(namespaces)).items()
                if (band := listed_band(settings.bands, record, ledger.half_life_of(record), detail)) is not None}

    def fair_share_listing(self) -> FairShareListing | None:
        """What the listing says of fair share as a whole (None when off): the bands' classes, lightest first, and
        how many webhook processes share the burst guard's room (at least the one polling)."""
        if self.fair_share is None:
            return None
        return FairShareListing(tuple(self.config.fair_share.bands.classes), max(1, self.webhooks.live()))

    def on_stop(self) -> list[Callable[[], None]]:
        """On SIGTERM, once the requests in flight are answered: the report queue, already empty, closes."""
        return [self.reports.close]


@dataclass
class Stores:
    """What the web replicas and the controller both keep in the database, reckoned by one clock."""

    database: Database
    clock: Clock
    budgets: BudgetStore
    ledger: ReportLedger
    idle: IdleLedger
    capacity: CapacityLedger  # the GPU nodes' capacity per hour: written by the controller, read for chargeback
    fair_share: FairShareLedger | None = None  # None: fair share is off


def build_stores(config: TimekeeperConfig, clock: Clock | None = None) -> Stores:
    """See timekeeper.app.create_app for what `clock` defaults to."""
    db = Database.from_config(config)
    if clock is None and config.clock == DEFAULT_CLOCK:
        clock = DatabaseClock(db.now)  # what replicas compare is reckoned by one clock, the database's
    elif clock is None:
        clock = ReadClock(load_code("TIMEKEEPER_CLOCK", config.clock))
        log.warning("TIMEKEEPER_CLOCK=%s: the time comes from a test clock, never use it in a cluster", config.clock)
    budgets = BudgetStore(db, config.default_gpu_minutes, config.default_period, clock.now, config.default_idle)
    fair_share = FairShareLedger(db, config.fair_share.half_life) if config.fair_share.enabled else None
    ledger = ReportLedger(budgets, catalogue=config.catalogue, catalogue_source=config.catalogue_source,
                          meter_interval_seconds=config.meter_interval_seconds, fair_share=fair_share,
                          prices=config.price_sheet, prices_source=config.price_sheet_source,
                          calendar=config.chargeback.calendar)
    return Stores(db, clock, budgets, ledger, IdleLedger(db), CapacityLedger(db), fair_share)


def build_services(
    config: TimekeeperConfig,
    kube: KubeApi | None = None,
    clock: Clock | None = None,
) -> Services:
    """The web replicas' services: no controller, no Lease (see timekeeper.controller)."""
    stores = build_stores(config, clock)
    if kube is None:
        kube = kube_api(config)
    if config.auth == "none":
        log.warning(NO_AUTH_WARNING)
    tokens = load_static_tokens(config.static_tokens_file) if config.static_tokens_file else StaticTokens({})
    auth = Authenticator(config.auth, tokens, kube, config.auth_cache_seconds, config.auth_wait_seconds,
                         config.node_agents, config.gpu_request.catalogue)
    # Replicas answer the webhooks alike: what the controller published, what is left of each deadline reckoned by
    # the database's clock.
    commitments = PublishedCommitments(stores.database, stores.clock.now, config.reservation_seconds)
    return Services(
        config,
        auth,
        stores.database,
        stores.budgets,
        ReservationStore(stores.budgets, config.reservation_seconds),
        stores.ledger,
        stores.idle,
        ReportQueue(stores.ledger),
        UtilisationLedger.of(stores.ledger),
        commitments,
        metrics.LedgerCollector(stores.ledger, commitments, stores.idle),
        head_revision(),
        WebhookListings(stores.database),
        stores.fair_share,
    )


def kube_api(config: TimekeeperConfig) -> KubeApi | None:
    """The Kubernetes API of the kubeconfig (TIMEKEEPER_KUBECONFIG, else KUBECONFIG) or of the cluster the timekeeper
    runs in; None when neither.

    ConfigError, one line saying what to set, when tokenreview has no API or the kubeconfig cannot be read.
    """
    in_cluster = in_cluster_available()
    if config.auth == "tokenreview" and not config.kubeconfig and not in_cluster:
        raise ConfigError(OFF_CLUSTER)
    if not config.kubeconfig and not in_cluster:
        return None
    try:
        from timekeeper.cluster.kube import KubeApi  # the official client, imported only by a process that calls it

        return KubeApi.from_kubeconfig(config.kubeconfig, config.eviction_concurrency)
    except ConfigError:
        raise
    except (yaml.YAMLError, TypeError, AttributeError, ValueError) as exc:  # the client's reading of a malformed file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"the kubeconfig {config.kubeconfig} (TIMEKEEPER_KUBECONFIG, else KUBECONFIG) is not one: {first}"
        ) from None
