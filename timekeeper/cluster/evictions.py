"""The controller's one eviction path, for every reason (a budget crossing, an idle policy, fair share).

Before a pod is evicted, every live webhook process has acknowledged the state its replacement will be admitted under,
and its eviction is claimed under the leader's term; the request leaves only while the Lease is surely held, and the
Eviction API keeps PodDisruptionBudgets. No pod's eviction is asked twice while an earlier request's answer may still
come. The protocol and why: docs/design/controller.md, "The eviction path".
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from gpusharing.kube.client import REQUEST_TIMEOUT_SECONDS
from timekeeper import metrics
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.leader import LeaderElection
from timekeeper.cluster.objects import EvictionAnswer, EvictionResult, KubeUnavailable
from timekeeper.database.cluster.fencing import KEPT_CLAIM_SECONDS, STALE_CLAIM_SECONDS, Claims, EvictionFence
from timekeeper.database.cluster.listings import WebhookListings

log = logging.getLogger(__name__)

CLAIM_BATCH = 50  # evictions claimed in one transaction
# Retries end, and their last request with them, before another leader may take the claim over as stale.
MAX_RETRY_SECONDS = STALE_CLAIM_SECONDS - REQUEST_TIMEOUT_SECONDS - 5.0
FIRST_BACKOFF_SECONDS = 0.5  # a 429 without Retry-After is asked again after this, doubled each time
MAX_BACKOFF_SECONDS = 5.0  # as `kubectl drain` retries an eviction a PodDisruptionBudget refused


class LeaseLost(Exception):
    """The controller no longer leads: the task stops where it is."""


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    owner: str = ""  # the uid of the object that controls it ("": none)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class Evictions:
    """What one call did: pods evicted, refused (429 until their claims were given back), gone already, unknown (their
    requests got no answer: claims kept, read before a later pass asks again); `waiting`, how many webhook processes
    it waited for (nothing was asked then)."""

    evicted: list[PodRef] = field(default_factory=list)
    refused: list[PodRef] = field(default_factory=list)
    gone: list[PodRef] = field(default_factory=list)
    unknown: list[PodRef] = field(default_factory=list)
    waiting: int = 0


@dataclass
class _Claimed:
    """A pod this call holds the claim of: under which term, since when (this process's monotonic time, read before
    the claim was asked, so never later than the database's), how many times a 429 answered; `read_first`: whether a
    request for it may have been granted unanswered (its pod is read before it is asked)."""

    pod: PodRef
    term: int
    since: float
    refusals: int = 0
    read_first: bool = False


class EvictionPath:
    """Evicts pods for every task of the controller: one per process, so that its pool bounds the requests in flight."""

    def __init__(self, kube: KubeApi, election: LeaderElection, fence: EvictionFence, webhooks: WebhookListings,
                 concurrency: int, retry_seconds: float, monotonic: Callable[[], float] = time.monotonic):
        """`concurrency`: requests in flight at once (TIMEKEEPER_EVICTION_CONCURRENCY); `retry_seconds`: how long
        after its claim an eviction answered 429 is asked again (TIMEKEEPER_EVICTION_RETRY_SECONDS, at most
        MAX_RETRY_SECONDS)."""
        self.kube = kube
        self.election = election
        self.fence = fence
        self.webhooks = webhooks
        self.concurrency = max(1, concurrency)
        self.retry_seconds = min(max(0.0, retry_seconds), MAX_RETRY_SECONDS)
        self._monotonic = monotonic  # real time: the waits between retries are real
        self._window = float(self.concurrency)
        # uid -> (term, when) of the claims this process keeps for requests that got no answer (this monotonic clock)
        self._unknown: dict[str, tuple[int, float]] = {}
        self._unknown_lock = threading.Lock()  # tasks' passes share it
        self._requests = ThreadPoolExecutor(self.concurrency, thread_name_prefix="eviction")

    @property
    def window(self) -> int:
        """Requests to keep in flight now: `concurrency`, halved by each request that failed (an API server too slow
        to answer within the Lease, or down), one more again with each answer, as TCP paces a congested link."""
        return int(self._window)

    def answered(self, failed: bool) -> None:
        """Halves the window after a request that failed, widens it by one after an answer."""
        self._window = max(1.0, self._window / 2) if failed else min(float(self.concurrency), self._window + 1)

    def close(self) -> None:
        """Waits for the requests under way (each bounded by its timeout) and stops the pool's threads."""
        self._requests.shutdown(wait=True)

    def keep_lease(self) -> None:
        """Raises LeaseLost unless this process still leads (renewing the Lease when it is due)."""
        if not self.election.keep():
            raise LeaseLost(f"lost the lease as {self.election.identity}")

    def evict(self, reason: str, pods: Sequence[PodRef], acknowledged_after: float,
              on_evicted: Callable[[PodRef], None] | None = None) -> Evictions:
        """Evicts `pods` for `reason` (words for the log) once every live webhook holds a listing read after
        `acknowledged_after` (the database's time, in seconds); `on_evicted` is told of each pod evicted (in this
        thread). LeaseLost when the Lease is lost on the way: the requests already sent are waited for, nothing
        more is asked, and every claim not evicted is given back, but those whose pods an unanswered request may
        have evicted (kept, for the pod to be read before it is asked again)."""
        done = Evictions()
        behind = self.webhooks.behind(acknowledged_after)
        if behind:
            done.waiting = behind
            return done
        _Pass(self, reason, pods, done, on_evicted).run()
        return done

    def _ask(self, pod: PodRef, read_first: bool) -> EvictionAnswer | KubeUnavailable | None:
        """One eviction request, on the pool: sent while the Lease is surely held, its connection (if one must be
        opened) given up once it may not be (None: no time left, not sent). Its answer is waited for the API's whole
        timeout: a request that left under the Lease acted under it. A pod whose request may have been granted
        unanswered is read first: gone, replaced or terminating, it is not asked again (GONE)."""
        if self.election.remaining_seconds() <= 0:
            return None
        try:
            if read_first:
                found = self.kube.read_pod(pod.namespace, pod.name)
                if (
                    found is None
                    or found.metadata is None
                    or found.metadata.uid != pod.uid
                    or found.metadata.deletion_timestamp
                ):
                    return EvictionAnswer(EvictionResult.GONE)
            remaining = self.election.remaining_seconds()
            if remaining <= 0:
                return None
            return self.kube.evict(pod.namespace, pod.name, pod.uid, send_within=remaining)
        except KubeUnavailable as exc:
            return exc

    def _keep_unknown(self, uid: str, term: int) -> None:
        """Remembers that the request for a pod this process holds the claim of (under `term`) got no answer; forgets
        what is older than any claim is kept."""
        now = self._monotonic()
        with self._unknown_lock:
            self._unknown[uid] = (term, now)
            for old in [uid for uid, (_, at) in self._unknown.items() if at < now - KEPT_CLAIM_SECONDS]:
                del self._unknown[old]

    def _take_unknown(self, uids: Sequence[str]) -> dict[str, tuple[int, float]]:
        """The pods among `uids` whose requests got no answer, with the term of the claim this process kept for each
        (and since when); no other pass takes them while this one holds them, until it puts them back."""
        with self._unknown_lock:
            return {uid: self._unknown.pop(uid) for uid in uids if uid in self._unknown}

    def _put_back_unknown(self, unknown: dict[str, tuple[int, float]]) -> None:
        with self._unknown_lock:
            for uid, kept in unknown.items():
                self._unknown.setdefault(uid, kept)


def _in_turn(pods: Sequence[PodRef]) -> list[PodRef]:
    """The pods by namespace and name, their owners in turn: a first pod of each owner, then a second..."""
    turns: dict[str, int] = {}
    ordered = sorted(pods, key=lambda pod: (pod.namespace, pod.name))
    ranked = []
    for index, pod in enumerate(ordered):
        owner = pod.owner or pod.uid
        turns[owner] = turns.get(owner, -1) + 1
        ranked.append((turns[owner], index, pod))
    return [pod for _, _, pod in sorted(ranked, key=lambda item: item[:2])]


class _Pass:
    """One call of EvictionPath.evict, in the calling task's thread: claims a batch when it runs short of claimed
    pods, keeps up to `concurrency` requests in flight, puts 429s back in line for their time, gives back at the end
    every claim it did not evict."""

    def __init__(self, path: EvictionPath, reason: str, pods: Sequence[PodRef], done: Evictions,
                 on_evicted: Callable[[PodRef], None] | None):
        self.path = path
        self.reason = reason
        self.done = done
        self.on_evicted = on_evicted
        self.unclaimed = deque(_in_turn(pods))
        self.ready: deque[_Claimed] = deque()
        self.later: list[tuple[float, int, _Claimed]] = []  # (when, order, pod): 429s waiting for their time
        self.in_flight: dict[Future[EvictionAnswer | KubeUnavailable | None], _Claimed] = {}
        self.held: dict[str, _Claimed] = {}  # uid -> the claims this call holds and has not evicted
        self.guarded: dict[str, float] = {}  # owner -> when its pods may be asked again (after a 429)
        # owner -> how many of its pods may be in flight once a 429 guards it: one, and one more with each granted
        # (what its PodDisruptionBudget lets through, found as TCP finds a window)
        self.allowance: Counter[str] = Counter()
        self.owners_in_flight: Counter[str] = Counter()
        self._order = 0

    def run(self) -> None:
        lost: LeaseLost | None = None
        try:
            while self.unclaimed or self.ready or self.later or self.in_flight:
                self._due()
                self._send_ready()
                if self.unclaimed and len(self.in_flight) < self.path.window:
                    self._claim_batch()
                    continue
                self._collect(self._wait_seconds())
        except LeaseLost as exc:
            lost = exc
        finally:
            while self.in_flight:  # sent already: what they did is recorded before the claims are given back
                try:
                    self._collect(None)
                except LeaseLost as exc:
                    lost = lost or exc
            # not read yet: whether an earlier request was granted is unknown still
            for uid, claim in self.held.items():
                if claim.read_first:
                    self.path._keep_unknown(uid, claim.term)
            given_back = {uid: claim for uid, claim in self.held.items() if not claim.read_first}
            for term in {claim.term for claim in given_back.values()}:
                self.path.fence.release(term, *(uid for uid, claim in given_back.items() if claim.term == term))
            # as answered: told in order of name
            for pods in (self.done.evicted, self.done.refused, self.done.gone, self.done.unknown):
                pods.sort(key=lambda pod: (pod.namespace, pod.name))
        if lost is not None:
            raise lost

    def _claim_batch(self) -> None:
        """Claims the next batch under the Lease's term. A pod whose request got no answer is claimed already, under
        this term if the Lease has not changed hands since: its claim is made fresh; every pod whose request may have
        been granted unanswered (this process's, or a former leader's claim taken over) is read before it is asked."""
        batch: dict[str, PodRef] = {}
        while self.unclaimed and len(batch) < CLAIM_BATCH:
            pod = self.unclaimed.popleft()
            batch[pod.uid] = pod
        self.path.keep_lease()
        term, since = self.path.election.term, self.path._monotonic()
        unknown = self.path._take_unknown(list(batch))
        kept = [uid for uid, (claimed_under, _) in unknown.items() if claimed_under == term]
        renewed = self.path.fence.renew(term, kept) if kept else set()
        rest = [(pod.uid, pod.namespace, pod.name) for uid, pod in batch.items() if uid not in (renewed or ())]
        claimed = self.path.fence.claim_many(term, rest) if renewed is not None and rest else Claims()
        if renewed is None or claimed is None:
            self.path._put_back_unknown(unknown)  # still unknown: whoever leads next reads them first
            raise LeaseLost(f"a later leader than {self.path.election.identity} (term {term}) has recorded itself")
        self.path._put_back_unknown(
            {uid: kept for uid, kept in unknown.items() if uid not in renewed and uid not in claimed}
        )
        for uid in (uid for uid in batch if uid in renewed or uid in claimed):
            read_first = uid in renewed or uid in unknown or uid in claimed.taken_over
            self.held[uid] = _Claimed(batch[uid], term, since, read_first=read_first)
            self.ready.append(self.held[uid])

    def _send_ready(self) -> None:
        """Sends what is ready, in order, while there is room: not the pods of an owner a 429 holds back (its time
        not come, or one of its pods in flight), which keep their place; those whose claims grew too old meanwhile
        are given up."""
        now, waiting = self.path._monotonic(), deque[_Claimed]()
        while self.ready and len(self.in_flight) < self.path.window:
            claim = self.ready.popleft()
            if not self._held_back(claim, now):
                self._send(claim)
            elif now >= claim.since + self.path.retry_seconds:
                self.done.refused.append(claim.pod)
                log.info("eviction of %s held back by its owner's PodDisruptionBudget; a later pass tries again (%s)",
                         claim.pod, self.reason, extra={"namespace": claim.pod.namespace, "pod": claim.pod.name})
            else:
                waiting.append(claim)
        self.ready.extendleft(reversed(waiting))

    def _held_back(self, claim: _Claimed, now: float) -> bool:
        owner = claim.pod.owner
        return bool(owner) and owner in self.guarded and (
            now < self.guarded[owner] or self.owners_in_flight[owner] >= self.allowance[owner])

    def _send(self, claim: _Claimed) -> None:
        self.path.keep_lease()
        if self.path.election.term != claim.term:  # lost and taken again meanwhile: the claim is a former term's
            raise LeaseLost(f"{self.path.election.identity} claimed {claim.pod} under term {claim.term}, now "
                            f"{self.path.election.term}")
        self.in_flight[self.path._requests.submit(self.path._ask, claim.pod, claim.read_first)] = claim
        self.owners_in_flight[claim.pod.owner] += 1

    def _due(self) -> None:
        now = self.path._monotonic()
        while self.later and self.later[0][0] <= now:
            self.ready.append(heapq.heappop(self.later)[2])

    def _wait_seconds(self) -> float | None:
        """How long to wait for an answer: not at all while a request could be sent, else until the next 429's time
        comes (a pod's, or its owner's), or (None) for the next answer."""
        now = self.path._monotonic()
        if len(self.in_flight) < self.path.window and any(not self._held_back(c, now) for c in self.ready):
            return 0.0
        times = [self.later[0][0]] if self.later else []
        times += [self.guarded[c.pod.owner] for c in self.ready if self.guarded.get(c.pod.owner, now) > now]
        return max(0.0, min(times) - now) if times else None

    def _collect(self, timeout: float | None) -> None:
        if not self.in_flight:
            if timeout:
                time.sleep(timeout)
            return
        answered, _ = wait(list(self.in_flight), timeout=timeout, return_when=FIRST_COMPLETED)
        for future in answered:
            claim = self.in_flight.pop(future)
            self.owners_in_flight[claim.pod.owner] -= 1
            self._record(claim, future.result())

    def _record(self, claim: _Claimed, answer: EvictionAnswer | KubeUnavailable | None) -> None:
        pod = claim.pod
        if answer is None:  # not sent: the Lease had no time left for it; renewed, it goes again, else LeaseLost
            self.path.keep_lease()
            self.ready.appendleft(claim)
            return
        fields = {"namespace": pod.namespace, "pod": pod.name}
        self.path.answered(failed=isinstance(answer, KubeUnavailable))
        if isinstance(answer, KubeUnavailable):
            # unknown: its claim is kept, not given back, and the pod read before it is asked again
            del self.held[pod.uid]
            self.path._keep_unknown(pod.uid, claim.term)
            self.done.unknown.append(pod)
            log.warning("%s; a later pass reads the pod before it asks again (%d evictions in flight at most now)",
                        answer, self.path.window, extra=fields)
            return
        result = answer.result
        metrics.EVICTIONS.labels(result.value).inc()
        fields["eviction"] = result.value
        if result is EvictionResult.REFUSED:
            claim.read_first = False  # read before it was asked, and running: no earlier request evicted it
            claim.refusals += 1
            backoff = min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2 ** (claim.refusals - 1)) * random.uniform(
                0.8, 1.2
            )
            when = self.path._monotonic() + (answer.retry_after if answer.retry_after is not None else backoff)
            if pod.owner:  # its owner's other pods would be refused as well: they wait as long, then go one at a time
                self.guarded[pod.owner] = max(self.guarded.get(pod.owner, 0.0), when)
                self.allowance[pod.owner] = 1
            if when < claim.since + self.path.retry_seconds:
                self._order += 1
                heapq.heappush(self.later, (when, self._order, claim))
                return
            self.done.refused.append(pod)
            log.info(
                "eviction of %s refused (429: a PodDisruptionBudget, or the API server's flow control) %d time(s); "
                "a later pass tries again (%s)",
                pod,
                claim.refusals,
                self.reason,
                extra=fields,
            )
            return
        del self.held[pod.uid]  # evicted, or gone already: its claim stands, so that no one asks again
        if result is EvictionResult.GONE:
            self.done.gone.append(pod)
            return
        self.done.evicted.append(pod)
        if pod.owner in self.guarded:
            self.allowance[pod.owner] += 1
        log.info("evicted pod %s: %s", pod, self.reason, extra=fields)
        if self.on_evicted is not None:
            self.on_evicted(pod)
