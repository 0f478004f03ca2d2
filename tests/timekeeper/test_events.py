"""The controller's Event queue: Events sent by the events task, a failed one giving its claim back, a full queue
dropping its oldest (counted), against the HTTP fake of the API."""

from __future__ import annotations

import pytest

from demo.kubeapi import FakeKube
from timekeeper import metrics
from timekeeper.cluster.events import Event, EventQueue
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.objects import ObjectRef


@pytest.fixture
def queue(fake_kube: FakeKube) -> EventQueue:
    return EventQueue(KubeApi(fake_kube.api_client()))


def pod_event(name: str, on_failure: object = None) -> Event:
    return Event("GPUIdle", f"pod {name} is idle", about=ObjectRef("v1", "Pod", name, f"uid-{name}", "ml"),
                 on_failure=on_failure)  # type: ignore[arg-type]


def test_queued_events_wait_for_the_events_task_and_are_sent_in_order(fake_kube: FakeKube) -> None:
    woken: list[int] = []
    queue = EventQueue(KubeApi(fake_kube.api_client()), wake=lambda: woken.append(1))
    queue.put(pod_event("a"))
    queue.put(Event("GPUBudgetExhausted", "over", namespace="team-a"))
    assert len(queue) == 2 and woken == [1, 1] and fake_kube.events == []  # put never calls the API
    assert queue.send() == 2 and len(queue) == 0
    assert [(e["reason"], e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in fake_kube.events] == [
        ("GPUIdle", "Pod", "a"), ("GPUBudgetExhausted", "Namespace", "team-a")]
    assert queue.send() == 0


def test_an_event_that_fails_gives_its_claim_back_and_the_rest_are_still_sent(
    queue: EventQueue, fake_kube: FakeKube,
) -> None:
    given_back: list[str] = []
    fake_kube.events_up = False
    queue.put(pod_event("a", on_failure=lambda: given_back.append("a")))
    queue.put(pod_event("b"))  # no claim to give back: only logged
    assert queue.send() == 0 and given_back == ["a"] and len(queue) == 0  # not kept: its maker queues it again
    fake_kube.events_up = True
    queue.put(pod_event("a", on_failure=lambda: given_back.append("again")))
    assert queue.send() == 1 and given_back == ["a"]


def test_an_event_about_a_deleted_namespace_is_not_sent_and_not_a_failure(
    queue: EventQueue, fake_kube: FakeKube
) -> None:
    given_back: list[str] = []
    fake_kube.deleted_namespaces.add("team-a")
    queue.put(Event("GPUBudgetExhausted", "over", namespace="team-a", on_failure=lambda: given_back.append("x")))
    queue.put(Event("GPUBudgetExhausted", "over", namespace="team.vision"))  # a group: no namespace to record it on
    assert queue.send() == 0 and given_back == [] and fake_kube.events == []


def dropped_count() -> float:
    (family,) = metrics.EVENTS_DROPPED.collect()
    return next(sample.value for sample in family.samples if sample.name.endswith("_total"))


def test_a_full_queue_drops_its_oldest_and_counts_it(fake_kube: FakeKube) -> None:
    queue = EventQueue(KubeApi(fake_kube.api_client()), size=2)
    dropped = dropped_count()
    for name in ("first", "second", "third"):
        queue.put(pod_event(name))
    assert len(queue) == 2 and dropped_count() == dropped + 1
    assert queue.send() == 2
    assert [e["involvedObject"]["name"] for e in fake_kube.events] == ["second", "third"]
