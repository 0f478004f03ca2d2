"""Each governed pod's reading from plain data: its processes' utilisation summed and capped at what it was allotted
(a whole GPU, a MIG instance, replicas of a time-sliced GPU, a sharing plugin's shares), 0 % where none of its
processes ran, unknown (never idle) where the node cannot tell, its memory; pods the agent cannot name left out."""

from __future__ import annotations

import pytest

from gpusharing.utilisation import PodUtilisation
from nodeagent.devices import DeviceWindow
from nodeagent.kubelet import NodeDevices, PodDevices
from nodeagent.readings import physical_device, pod_readings

A, B, C = (
    "0b8a3c1e-2f4d-4c55-9d0e-6a7b8c9d0e1f",
    "1c9b4d2f-3a5e-4d66-8e1f-7b8c9d0e1f2a",
    "2dac5e3a-4b6f-4e77-9f2a-8c9d0e1f2a3b",
)
GPU0, GPU1 = "GPU-5b2b8a1e-0000-1111-2222-333344445555", "GPU-5b2b8a1e-0000-1111-2222-333344446666"
MIG0 = "MIG-9c1d2e3f-aaaa-bbbb-cccc-ddddeeeeffff"
MIB = 1024 * 1024
UIDS = {("team-a", "a"): A, ("team-b", "b"): B, ("team-c", "c"): C}


def window(
    uuid: str,
    busy: dict[int, float] | None,
    device: float | None = None,
    processes: dict[int, int | None] | None = None,
) -> DeviceWindow:
    return DeviceWindow(uuid, busy, device, tuple((processes or {}).items()))


def node(*pods: tuple[str, list[tuple[str, str]]], allocatable: list[tuple[str, str]] | None = None) -> NodeDevices:
    found = [PodDevices(*key.split("/"), tuple(devices)) for key, devices in pods]
    return NodeDevices(tuple(found), tuple(allocatable) if allocatable is not None else None)


def readings(
    devices: NodeDevices, windows: list[DeviceWindow], owners: dict[int, str]
) -> dict[str, tuple[float | None, float | None]]:
    found = pod_readings(devices, {w.uuid: w for w in windows}, owners, UIDS)
    return {r.pod: (r.utilisation_percent, r.memory_used_mib) for r in found}


def test_a_whole_gpu_reads_its_pods_processes_summed_and_nobody_elses() -> None:
    devices = node(("team-a/a", [("nvidia.com/gpu", GPU0)]), ("team-b/b", [("nvidia.com/gpu", GPU1)]))
    windows = [window(GPU0, {10: 30.0, 11: 25.5, 99: 40.0}, processes={10: 512 * MIB, 11: 256 * MIB, 99: MIB}),
               window(GPU1, {}, processes={20: 1024 * MIB})]  # no sample on GPU1: b's process ran nothing
    assert readings(devices, windows, {10: A, 11: A, 20: B}) == {"a": (55.5, 768.0), "b": (0.0, 1024.0)}


def test_the_readings_are_the_contracts() -> None:
    found = pod_readings(
        node(("team-a/a", [("nvidia.com/gpu", GPU0)])),
        {GPU0: window(GPU0, {10: 7.0}, processes={10: 2 * MIB})},
        {10: A},
        UIDS,
    )
    assert found == (PodUtilisation(A, "team-a", "a", 7.0, 2.0),)


def test_time_sliced_replicas_are_the_pods_share_of_the_gpu_and_cap_its_reading() -> None:
    """Four replicas of GPU0: a holds one (a quarter), b holds two (a half)."""
    allocatable = [("nvidia.com/gpu", f"{GPU0}::{n}") for n in range(4)]
    devices = node(
        ("team-a/a", [("nvidia.com/gpu", f"{GPU0}::0")]),
        ("team-b/b", [("nvidia.com/gpu", f"{GPU0}::1"), ("nvidia.com/gpu", f"{GPU0}::2")]),
        allocatable=allocatable,
    )
    owners = {10: A, 20: B}
    assert readings(devices, [window(GPU0, {10: 20.0, 20: 10.0})], owners) == {"a": (80.0, 0.0), "b": (20.0, 0.0)}
    # capped: 60 % of a GPU it has a quarter of
    assert readings(devices, [window(GPU0, {10: 60.0, 20: 0.0})], owners)["a"] == (100.0, 0.0)


def test_without_the_nodes_allocatable_devices_the_replicas_held_are_the_whole() -> None:
    devices = node(("team-a/a", [("nvidia.com/gpu", f"{GPU0}::0")]), ("team-b/b", [("nvidia.com/gpu", f"{GPU0}::3")]))
    assert readings(devices, [window(GPU0, {10: 20.0, 20: 10.0})], {10: A, 20: B}) == {
        "a": (40.0, 0.0),
        "b": (20.0, 0.0),
    }


def test_a_pod_on_two_gpus_reads_the_share_of_both_it_used() -> None:
    devices = node(("team-a/a", [("nvidia.com/gpu", GPU0), ("nvidia.com/gpu", GPU1)]))
    assert readings(devices, [window(GPU0, {10: 90.0}), window(GPU1, {})], {10: A})["a"] == (45.0, 0.0)


def test_what_a_pod_uses_beyond_one_devices_share_does_not_make_up_for_another_it_leaves_idle() -> None:
    devices = node(("team-a/a", [("nvidia.com/gpu", GPU0), ("nvidia.com/gpu", GPU1)]))
    assert readings(devices, [window(GPU0, {10: 80.0, 11: 70.0}), window(GPU1, {})], {10: A, 11: A})["a"] == (50.0, 0.0)


def test_a_sharing_plugins_shares_name_their_gpu_by_prefix() -> None:
    """gpushare's ids are `<uuid>-_-<n>` per unit of memory; the pod holds 4 of 16 units of GPU0."""
    allocatable = [("aliyun.com/gpu-mem", f"{GPU0}-_-{n}") for n in range(16)]
    devices = node(("team-a/a", [("aliyun.com/gpu-mem", f"{GPU0}-_-{n}") for n in range(4)]), allocatable=allocatable)
    assert readings(devices, [window(GPU0, {10: 10.0}), window(GPU1, {11: 90.0})], {10: A, 11: A})["a"] == (40.0, 0.0)


@pytest.mark.parametrize(("device_id", "uuid"), [
    (GPU0, GPU0), (f"{GPU0}::7", GPU0), (f"{GPU0}-3", GPU0), (f"{GPU0}-_-12", GPU0), (MIG0, MIG0),
    (GPU0[:-2], None), (f"{GPU0}7", None), ("vcuda-core-0", None),
])
def test_a_device_id_names_the_nvml_device_it_is_or_shares(device_id: str, uuid: str | None) -> None:
    assert physical_device(device_id, {GPU0: 1, GPU1: 1, MIG0: 1}) == uuid


def test_a_mig_instance_reads_its_own_utilisation_and_unknown_without_gpm() -> None:
    devices = node(("team-a/a", [("nvidia.com/mig-1g.10gb", MIG0)]))
    assert readings(devices, [window(MIG0, None, 35.0, {10: 3 * MIB})], {10: A}) == {"a": (35.0, 3.0)}
    assert readings(devices, [window(MIG0, None, None, {10: 3 * MIB})], {10: A}) == {"a": (None, 3.0)}


def test_without_per_process_samples_the_device_is_the_pods_only_if_it_holds_it_alone() -> None:
    alone = node(
        ("team-a/a", [("nvidia.com/gpu", f"{GPU0}::0")]),
        allocatable=[("nvidia.com/gpu", f"{GPU0}::{n}") for n in range(2)],
    )
    assert readings(alone, [window(GPU0, None, 30.0)], {10: A})["a"] == (60.0, 0.0)  # 30 % of a GPU it has half of
    shared = node(("team-a/a", [("nvidia.com/gpu", f"{GPU0}::0")]), ("team-b/b", [("nvidia.com/gpu", f"{GPU0}::1")]))
    # whose 30 %? unknown
    assert readings(shared, [window(GPU0, None, 30.0)], {10: A}) == {"a": (None, 0.0), "b": (None, 0.0)}


def test_a_device_no_nvml_device_answers_to_leaves_the_pod_unknown_never_idle() -> None:
    devices = node(
        ("team-a/a", [("nvidia.com/gpu", GPU0), ("tencent.com/vcuda-core", "vcuda-3")]),
        ("team-b/b", [("nvidia.com/gpu", GPU1)]),
    )
    assert readings(devices, [window(GPU0, {}), window(GPU1, {})], {}) == {"a": (None, 0.0), "b": (0.0, 0.0)}


def test_memory_the_driver_will_not_disclose_is_unknown() -> None:
    devices = node(("team-a/a", [("nvidia.com/gpu", GPU0)]))
    assert readings(devices, [window(GPU0, {10: 5.0}, processes={10: MIB, 11: None})], {10: A, 11: A})["a"] == (
        5.0,
        None,
    )


def test_a_pod_whose_uid_is_unknown_is_left_out() -> None:
    devices = node(("team-a/a", [("nvidia.com/gpu", GPU0)]), ("team-z/z", [("nvidia.com/gpu", GPU1)]))
    assert list(readings(devices, [window(GPU0, {}), window(GPU1, {})], {})) == ["a"]


def test_each_reading_names_the_model_of_the_gpus_the_pod_was_given_and_none_where_they_differ() -> None:
    t4, h100 = "Tesla T4", "NVIDIA H100 80GB HBM3"
    devices = node(("team-a/a", [("nvidia.com/gpu", GPU0)]),
                   ("team-b/b", [("nvidia.com/gpu", GPU0), ("nvidia.com/gpu", GPU1)]),
                   ("team-c/c", [("nvidia.com/gpu", "GPU-not-on-this-node")]))
    windows = {GPU0: DeviceWindow(GPU0, {}, None, (), t4), GPU1: DeviceWindow(GPU1, {}, None, (), h100)}
    found = {r.pod: r.gpu_model for r in pod_readings(devices, windows, {}, UIDS)}
    assert found == {"a": t4, "b": None, "c": None}  # two models: not one to name; no device: nothing to name
    reading = PodUtilisation(A, "team-a", "a", 0.0, None, t4)
    assert PodUtilisation.from_json(reading.to_json()) == reading
