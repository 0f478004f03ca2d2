"""The `idle` task of the controller's leader: idle policies acted on for GPU pods nobody uses.

Each running pod's idle streak is judged by the policy in force (gpusharing.idle.verdict); each streak is warned of
once (`GPUIdleWarning`) and acted on once (`GPUIdle`), claimed in the database first so that two leaders never both
act. A demoted or evicted pod's owner is held out of budget from its warning on, and the pod evicted through the one
eviction path once every webhook has acknowledged the hold. What each action does: docs/budgets.md, "Idle GPUs".
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpusharing.idle.policy import IdleAction, PolicyInForce
from gpusharing.idle.verdict import IdleState, IdleVerdict, PodFacts, Streak, verdict
from gpusharing.kube.watching import WatchedObjects
from gpusharing.units.duration import format_duration
from gpusharing.units.weights import MICROS_PER_SECOND
from gpusharing.utilisation import UtilisationSource
from timekeeper import metrics
from timekeeper.accounting.record import RecordedPod
from timekeeper.budgets.hierarchy import idle_policy_of
from timekeeper.budgets.periods import iso_utc, period_window
from timekeeper.budgets.status import Budget, BudgetStatus
from timekeeper.cluster.events import Event, EventQueue
from timekeeper.cluster.evictions import EvictionPath, PodRef
from timekeeper.cluster.informers import GovernedPod
from timekeeper.cluster.objects import ObjectRef
from timekeeper.cluster.resources import IdleStatus
from timekeeper.database.accounting.streaks import Hold, IdleLedger, IdleUse, Step
from timekeeper.database.budgets.store import BudgetStore

log = logging.getLogger(__name__)

IDLE_WARNING = "GPUIdleWarning"
IDLE = "GPUIdle"
FORGET_HOLDS_AFTER = dt.timedelta(days=7)
# The Clock that stamps a hold is the database's carried forward between readings (timekeeper.database.clock): off by
# milliseconds at most, so a listing read this much after held_at surely holds the hold.
HELD_AT_SLACK_SECONDS = 1.0


@dataclass
class IdlePass:
    """What one run of the `idle` task did."""

    warned: list[str] = field(default_factory=list)  # namespace/pod: GPUIdleWarning
    acted: list[str] = field(default_factory=list)  # namespace/pod: GPUIdle (the action taken, or why none was)
    evicted: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # evictions a PodDisruptionBudget refused: tried again
    waiting: list[str] = field(default_factory=list)  # evictions waiting for the webhooks to acknowledge the hold
    held: list[str] = field(default_factory=list)  # namespace/Kind/name: owners held out of budget
    released: list[str] = field(default_factory=list)  # holds ended
    verdicts: dict[str, tuple[RecordedPod, IdleVerdict]] = field(default_factory=dict)  # uid -> the running pods'
    use: dict[str, IdleUse] = field(default_factory=dict)  # namespace -> idle GPU time per day


class Idler:
    """The `idle` task of the controller's leader, on the shared pod cache."""

    def __init__(
        self, idle: IdleLedger, budgets: BudgetStore, pods: WatchedObjects[GovernedPod], evictions: EvictionPath,
        events: EventQueue, fresh_seconds: float,
    ):
        self.idle = idle
        self.budgets = budgets
        self.pods = pods
        self.evictions = evictions
        self.events = events
        self.fresh_seconds = fresh_seconds  # a meter's reading older than this is unknown (two meter intervals)
        self.last: IdlePass | None = None
        # Owner uid -> the database's time (the webhooks' listings' clock) once this process saw its hold written.
        self._held_seen: dict[str, float] = {}
        # Pods whose action was due on an earlier run and did not happen then (the webhooks had not acknowledged the
        # hold, or a PodDisruptionBudget refused): since when, and why, to say how late the action comes.
        self._held_back: dict[str, tuple[dt.datetime, str]] = {}

    def run(self, now: dt.datetime) -> IdlePass | None:
        """One pass; None until the pod cache has listed the cluster. LeaseLost when the Lease is lost on the way."""
        items = self.pods.items
        if items is None:
            return None
        pods = {key: pod.record for key, pod in list(items.items())}
        done = IdlePass()
        running = {p.uid: p for p in pods.values() if p.started_at and p.finished_at is None and p.deleted_at is None}
        self._held_back = {uid: held for uid, held in self._held_back.items() if uid in running}
        ledgers = self.idle.pods(running.keys())
        budgets = self.budgets.budgets()
        holds = {hold.owner.uid: hold for hold in self.idle.holds()}
        self._held_seen = {uid: seen for uid, seen in self._held_seen.items() if uid in holds}
        for uid, pod in sorted(running.items(), key=lambda item: (item[1].namespace, item[1].name)):
            record = ledgers.get(uid)
            if record is None:
                continue  # not observed yet
            policy = idle_policy_of(budgets, pod.namespace, self.budgets.default_idle)
            # The node's (or Prometheus's) reading where fresh, else the meter's: policies act on the node's word.
            judged = verdict(record.streak, record.reading, policy, PodFacts(pod.started_at, pod.idle_exempt), now,
                             self.fresh_seconds)
            done.verdicts[uid] = (pod, judged)
            if policy is None:
                continue
            if (judged.warning_due or judged.action_due) and record.idle_acted_at is None:
                self._hold(pod, policy, holds, now, done)
            if judged.action_due and record.idle_acted_at is None:
                self._act(pod, record.streak, judged, policy, holds, now, done)
            elif judged.warning_due and record.idle_warned_at is None:
                if self._tell(pod, record.streak, "idle_warned_at", IDLE_WARNING, _warning(pod, judged, policy), now):
                    done.warned.append(f"{pod.namespace}/{pod.name}")
                    metrics.IDLE_ACTIONS.labels("warning", "done").inc()
        self._release(holds, pods, budgets, done, now)
        # The idle GPU time of the periods in use since the earliest one's start (all of it only under period none).
        kinds = {budget.period for budget in budgets.values()} | {self.budgets.default_period}
        done.use = self.idle.idle_use(min(period_window(kind, now).start for kind in kinds).date())
        self.last = done
        return done

    # -- acting --------------------------------------------------------------------------------------------------

    def _hold(self, pod: RecordedPod, policy: PolicyInForce, holds: dict[str, Hold], now: dt.datetime,
              done: IdlePass) -> None:
        """Holds the owner of a pod the policy will evict, from its warning on: by its deadline every webhook
        admits the owner's next pods out of budget, and the eviction waits only for their acknowledgement."""
        if pod.owner is None or pod.owner.uid in holds or self._spared(pod, policy.policy.action) \
                or policy.policy.action is IdleAction.WARN:
            return
        holds[pod.owner.uid] = self.idle.hold(pod.namespace, pod.owner, pod.name, now)
        self._held_seen[pod.owner.uid] = self.evictions.webhooks.now()
        done.held.append(f"{pod.namespace}/{pod.owner.kind}/{pod.owner.name}")

    def _act(self, pod: RecordedPod, streak: Streak, judged: IdleVerdict, policy: PolicyInForce,
             holds: dict[str, Hold], now: dt.datetime, done: IdlePass) -> None:
        action = policy.policy.action
        said = _idle_for(pod, judged) + f": {_rule(policy)}"
        spared = self._spared(pod, action)
        if action is IdleAction.WARN or spared:
            told = (
                f"{said}; nothing else is done" if action is IdleAction.WARN else f"{said}; it is not evicted: {spared}"
            )
            if self._tell(pod, streak, "idle_acted_at", IDLE, told, now):
                done.acted.append(f"{pod.namespace}/{pod.name}")
                metrics.IDLE_ACTIONS.labels(str(action), "spared" if spared else "done").inc()
            return
        # The owner's replacement must be admitted under the hold: every webhook has acknowledged it first.
        hold = holds.get(pod.owner.uid) if pod.owner is not None else None
        # By the listings' clock (the database's). A hold another leader wrote counts from its held_at, read by the
        # database's clock too, with HELD_AT_SLACK_SECONDS for the little the Clock carried it forward; a held_at
        # the listings' clock has not reached yet (a test's Clock ahead of the database's) counts from now.
        acknowledged_after = (self._held_seen.setdefault(
            hold.owner.uid, min(hold.held_at.timestamp() + HELD_AT_SLACK_SECONDS, self.evictions.webhooks.now()))
            if hold is not None else 0.0)
        ref = PodRef(pod.namespace, pod.name, pod.uid, pod.owner.uid if pod.owner is not None else "")
        result = self.evictions.evict(f"its GPU is idle ({_rule(policy)})", [ref], acknowledged_after)
        if result.waiting:
            done.waiting.append(str(ref))
            self._held_back.setdefault(pod.uid, (now, "once every webhook acknowledged the hold"))
            return
        if result.refused:
            self._held_back.setdefault(pod.uid, (now, "once its PodDisruptionBudget allowed"))
            done.refused.append(str(ref))
            metrics.IDLE_ACTIONS.labels(str(action), "refused").inc()
            return
        assert streak.since is not None
        if not result.evicted or not self.idle.claim(pod.uid, streak.since, "idle_acted_at", now):
            return  # gone meanwhile, or acted on already
        metrics.IDLE_ACTIONS.labels(str(action), "evicted").inc()
        log.info(
            "idle pod %s evicted %s",
            ref,
            self._when(pod.uid, now),
            extra={
                "namespace": pod.namespace,
                "pod": pod.name,
                "deadline": iso_utc(judged.act_at) if judged.act_at else None,
            },
        )
        done.evicted.append(str(ref))
        done.acted.append(str(ref))
        held = (f"; {pod.owner.kind} {pod.owner.name}'s next pods are admitted out of budget until one uses its GPU"
                if pod.owner is not None else "")
        self._events(pod, IDLE, f"{said}; evicted{held}")

    def _when(self, uid: str, now: dt.datetime) -> str:
        """When an action came, in idle runs: on the first that found it due, or how much later, and why."""
        held_back = self._held_back.pop(uid, None)
        if held_back is None:
            return "on the first idle run it was due"
        since, why = held_back
        return f"{(now - since).total_seconds():.1f} s after it was first due, {why}"

    def _spared(self, pod: RecordedPod, action: IdleAction) -> str | None:
        """Why `demote` leaves a pod running: nothing would re-create it, or it already runs out of budget."""
        if action is not IdleAction.DEMOTE:
            return None
        if pod.owner is None:
            return "it has no owner to re-create it demoted (the action evict would stop it)"
        if pod.demoted:
            return "it already runs out of budget (the webhook admitted it demoted)"
        return None

    def _tell(self, pod: RecordedPod, streak: Streak, step: Step, reason: str, message: str, now: dt.datetime) -> bool:
        """An Event, once per streak: claimed first, given back when it cannot be sent; whether this pass queued it."""
        assert streak.since is not None
        since = streak.since
        if not self.idle.claim(pod.uid, since, step, now):
            return False
        self._events(pod, reason, message, on_failure=lambda: self.idle.release(pod.uid, since, step))
        return True

    def _events(
        self, pod: RecordedPod, reason: str, message: str, on_failure: Callable[[], None] | None = None
    ) -> None:
        """The Event on the pod, and on its owner as `kubectl describe` shows it (a ReplicaSet's Deployment).
        `on_failure`: when the pod's cannot be sent (the owner's is only logged)."""
        self.events.put(Event(reason, message, about=ObjectRef("v1", "Pod", pod.name, pod.uid, pod.namespace),
                              on_failure=on_failure))
        log.warning("%s", message, extra={"namespace": pod.namespace, "pod": pod.name, "event": reason})
        if pod.owner is not None:
            owner = ObjectRef(pod.owner.api_version, pod.owner.kind, pod.owner.name, pod.owner.uid, pod.namespace)
            self.events.put(Event(reason, message, about=owner, shown_owner=True))

    # -- holds ---------------------------------------------------------------------------------------------------

    def _release(self, holds: Mapping[str, Hold], pods: Mapping[tuple[str, str], RecordedPod],
                 budgets: Mapping[str, Budget], done: IdlePass, now: dt.datetime) -> None:
        """Ends the holds of owners whose GPU is used again, whose policy no longer evicts, or long gone."""
        busy = {pod.owner.uid for pod, judged in done.verdicts.values() if pod.owner and judged.state is IdleState.BUSY}
        seen = {pod.owner.uid for pod in pods.values() if pod.owner is not None}
        ended = []
        for uid, hold in holds.items():
            policy = idle_policy_of(budgets, hold.namespace, self.budgets.default_idle)
            lifted = policy is None or policy.policy.action is IdleAction.WARN
            if uid in busy or lifted or (uid not in seen and now - hold.held_at > FORGET_HOLDS_AFTER):
                ended.append(uid)
                done.released.append(f"{hold.namespace}/{hold.owner.kind}/{hold.owner.name}")
        self.idle.release_holds(ended)


def budget_idle(statuses: Mapping[str, BudgetStatus], done: IdlePass | None) -> dict[str, IdleStatus]:
    """Each budget's idle GPU-hours in its current period and its pods idle beyond their warning (a group's: those of
    the namespaces below it)."""
    if done is None:
        return {}
    below: dict[str, set[str]] = {}
    for name, status in statuses.items():
        if status.kind == "namespace":
            for budget in (name, *(ancestor.namespace for ancestor in status.ancestors)):
                below.setdefault(budget, set()).add(name)
    beyond: dict[str, list[str]] = {}
    for pod, judged in done.verdicts.values():
        if judged.warning_due or judged.action_due:
            beyond.setdefault(pod.namespace, []).append(
                f"{pod.namespace}/{pod.name} (idle {format_duration(round(judged.idle_seconds))})"
            )
    result = {}
    for name, status in statuses.items():
        window = status.window
        namespaces = sorted(below.get(name, set()))
        idle = sum(done.use[ns].between(window.start.date(), window.end.date() if window.end else None)[0]
                   for ns in namespaces if ns in done.use)
        result[name] = IdleStatus(
            idle / MICROS_PER_SECOND / 3600, tuple(p for ns in namespaces for p in sorted(beyond.get(ns, [])))
        )
    return result


def _idle_for(pod: RecordedPod, judged: IdleVerdict) -> str:
    assert judged.policy is not None
    whose = {UtilisationSource.METER: "meter", UtilisationSource.NODE: "node agent",
             UtilisationSource.PROMETHEUS: "Prometheus"}[judged.source]
    return (f"the GPU of pod {pod.name} has been idle for {format_duration(round(judged.idle_seconds))} (every {whose} "
            f"reading under {judged.policy.policy.utilisation_percent:g} % utilisation)")


def _rule(policy: PolicyInForce) -> str:
    whose = f"the budget of {policy.source}" if policy.source else "the default budget"
    return f"the idle policy of {whose}: {policy.policy.describe()}"


def _warning(pod: RecordedPod, judged: IdleVerdict, policy: PolicyInForce) -> str:
    assert judged.act_at is not None
    action = {IdleAction.WARN: "it will be reported idle", IdleAction.DEMOTE: "it will be demoted",
              IdleAction.EVICT: "it will be evicted"}[policy.policy.action]
    when = judged.act_at.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{_idle_for(pod, judged)}: {action} at {when} unless it uses its GPU ({_rule(policy)})"
