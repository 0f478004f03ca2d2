"""Leader election through a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

One controller process holds the Lease and runs the leader's tasks; another takes it over once it has seen the record
unchanged for the Lease's duration by its own monotonic clock. `keep()`, called before each act, renews the Lease once
a third of it has passed, so that work outlasting the Lease stops the moment it is lost. `term` fences what the holder
does in the database (timekeeper.database.cluster.fencing). Why: docs/design/controller.md, "The Lease".
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from gpusharing.outage import Outage
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.objects import KubeUnavailable

log = logging.getLogger(__name__)

LEASE_NAME = "gpusharing-timekeeper"


class LeaderElection:
    """This process's candidacy for the Lease; `leading` and `term` say whether, and under which term, it holds it."""

    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        identity: str,
        lease_seconds: float,
        name: str = LEASE_NAME,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = max(1, int(round(lease_seconds)))
        self._monotonic = monotonic
        self._observed: tuple[Any, ...] | None = None  # the record as last seen, and when (by our clock)
        self._observed_at = 0.0
        self._renewed_at = 0.0  # when the last successful write of ours was sent, by our clock
        self.leading = False
        self._outage = Outage(log, f"the Lease {namespace}/{name}", "renewals", monotonic)
        self.term = 0  # the Lease's leaseTransitions when this process took it
        self._writing = threading.Lock()  # one read-and-write of the Lease at a time, whichever thread asks

    def try_acquire_or_renew(self) -> bool:
        """Takes or renews the Lease; False while another process holds it, or when the API cannot be reached."""
        with self._writing:
            return self._acquire_or_renew()

    def _acquire_or_renew(self) -> bool:
        was_leading = self.leading
        try:
            self.leading = self._try()
            self._outage.succeeded()
        except KubeUnavailable as exc:
            self._outage.failed(exc, "this process does not lead meanwhile: GPUBudgets are not synced, no Event is "
                                "written and no pod evicted")
            self.leading = False
        if self.leading != was_leading:
            log.info(
                "%s the lease %s/%s as %s", "took" if self.leading else "lost", self.namespace, self.name, self.identity
            )
        return self.leading

    def remaining_seconds(self) -> float:
        """How much longer the Lease is surely ours (0 when it is not)."""
        return max(0.0, self._renewed_at + self.lease_seconds - self._monotonic()) if self.leading else 0.0

    def keep(self) -> bool:
        """Before each act of the leader: renews the Lease once a third of it has passed; False once it is lost (or
        has run out unrenewed), and the act must not happen. One renewal at a time, whichever thread asks: two
        racing writes would answer 409 and read as the Lease lost."""
        if self._renewal_due():
            with self._writing:
                if self._renewal_due():  # not renewed by another thread meanwhile
                    self._acquire_or_renew()
        return self.remaining_seconds() > 0

    def _renewal_due(self) -> bool:
        return self.leading and self._monotonic() - self._renewed_at >= self.lease_seconds / 3

    def release(self) -> None:
        """Gives the Lease up if this process holds it, so that another takes over without waiting for it to lapse."""
        with self._writing:
            self._release()

    def _release(self) -> None:
        if not self.leading:
            return
        self.leading = False
        try:
            lease = self.kube.read_lease(self.namespace, self.name)
            if lease is not None and lease.spec is not None and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                lease.spec.renew_time = _now()
                self.kube.replace_lease(self.namespace, self.name, lease)
        except KubeUnavailable as exc:
            log.warning("could not give up the lease %s/%s: %s (it lapses by itself)", self.namespace, self.name, exc)

    def _try(self) -> bool:
        now = _now()
        lease = self.kube.read_lease(self.namespace, self.name)
        if lease is None:
            spec = client.V1LeaseSpec(holder_identity=self.identity, lease_duration_seconds=self.lease_seconds,
                                      acquire_time=now, renew_time=now, lease_transitions=0)
            body = client.V1Lease(metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace), spec=spec)
            sent = self._monotonic()
            if not self.kube.create_lease(self.namespace, body):  # another process created it first
                return False
            self._renewed_at, self.term = sent, 0
            return True
        spec = lease.spec or client.V1LeaseSpec()
        record = (spec.holder_identity, spec.renew_time, spec.lease_transitions, spec.lease_duration_seconds)
        if record != self._observed:
            self._observed, self._observed_at = record, self._monotonic()
        holder = spec.holder_identity
        duration = spec.lease_duration_seconds or self.lease_seconds
        if holder and holder != self.identity and self._monotonic() < self._observed_at + duration:
            return False
        if holder != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = self.lease_seconds
        spec.renew_time = now
        lease.spec = spec
        # Carries the resourceVersion read: a process that wrote in between makes this one 409, and it lost.
        sent = self._monotonic()
        written = self.kube.replace_lease(self.namespace, self.name, lease)
        if written is None or written.spec is None:
            return False
        self._observed = (written.spec.holder_identity, written.spec.renew_time, written.spec.lease_transitions,
                          written.spec.lease_duration_seconds)
        self._observed_at = self._monotonic()
        self._renewed_at, self.term = sent, written.spec.lease_transitions or 0
        return True


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)
