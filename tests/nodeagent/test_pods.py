"""Whose a GPU process is, from the host's /proc/<pid>/cgroup under each layout the kubelet makes (cgroup v1 and v2,
systemd and cgroupfs drivers, seen from another cgroup namespace), and a pod's uid from the kubelet's log
directories."""

from __future__ import annotations

import os
from pathlib import Path

from nodeagent.pods import pod_uids, pods_of_processes
from tests.nodeagent.kubelet import Pod, cgroupfs_v1, guaranteed_from_another_namespace, node_view, systemd_cgroup

A, B, C = (
    "0b8a3c1e-2f4d-4c55-9d0e-6a7b8c9d0e1f",
    "1c9b4d2f-3a5e-4d66-8e1f-7b8c9d0e1f2a",
    "2dac5e3a-4b6f-4e77-9f2a-8c9d0e1f2a3b",
)


def test_each_process_is_its_pods_under_every_cgroup_layout_and_the_hosts_are_nobodys(tmp_path: Path) -> None:
    proc, _ = node_view(tmp_path, {
        10: systemd_cgroup(A),  # v2, systemd driver, Burstable
        11: systemd_cgroup(B, "besteffort"),
        12: cgroupfs_v1(C),  # v1, cgroupfs driver
        13: guaranteed_from_another_namespace(A),
        20: "0::/system.slice/nvidia-persistenced.service\n",  # the host's, no pod
        21: "0::/user.slice/user-1000.slice/session-3.scope\n",
    }, [])
    assert pods_of_processes(proc, [10, 11, 12, 13, 20, 21, 99]) == {10: A, 11: B, 12: C, 13: A}  # 99: gone


def test_a_uid_is_read_only_where_the_kubelet_puts_it_not_from_a_name_that_holds_one(tmp_path: Path) -> None:
    """A tenant names its own things; only the pod's cgroup level (pod<uid>) counts, not a container or unit named
    so."""
    proc, _ = node_view(tmp_path, {
        30: f"0::/system.slice/mypod{A}.service\n",
        31: f"0::/user.slice/pod{A}-helper.scope\n",
    }, [])
    assert pods_of_processes(proc, [30, 31]) == {}


def test_a_cgroup_a_tenant_makes_inside_its_own_pod_cannot_name_another_pod(tmp_path: Path) -> None:
    """A container allowed to make cgroups (a privileged one) can name one after another pod: the kubelet's level,
    nearer the root, is the one read."""
    nested = systemd_cgroup(A).replace(".scope\n", f".scope/kubepods-pod{B.replace('-', '_')}.slice/work.scope\n")
    proc, _ = node_view(tmp_path, {40: nested, 41: f"5:memory:/kubepods/burstable/pod{A}/0a1b/pod{B}/x\n"}, [])
    assert pods_of_processes(proc, [40, 41]) == {40: A, 41: A}


def test_pod_uids_come_from_the_kubelets_log_directories(tmp_path: Path) -> None:
    pods = [Pod("team-a", "trainer", A), Pod("team-b", "db-0", B), Pod("team-b", "notebook.v2", C)]
    _, logs = node_view(tmp_path, {}, pods)
    (logs / "not-a-pod-dir").mkdir()
    (logs / "Team_X_bad").mkdir()  # not a namespace's name
    assert pod_uids(logs, set()) == {("team-a", "trainer"): A, ("team-b", "db-0"): B, ("team-b", "notebook.v2"): C}


def test_a_pod_created_again_under_its_name_is_the_one_running_else_the_newest(tmp_path: Path) -> None:
    _, logs = node_view(tmp_path, {}, [Pod("team-b", "db-0", A), Pod("team-b", "db-0", B)])
    os.utime(logs / f"team-b_db-0_{A}", (1000, 1000))
    os.utime(logs / f"team-b_db-0_{B}", (2000, 2000))
    assert pod_uids(logs, set()) == {("team-b", "db-0"): B}  # the newest
    assert pod_uids(logs, {A}) == {("team-b", "db-0"): A}  # the one whose processes run on a GPU


def test_without_the_log_directories_no_pod_is_named(tmp_path: Path) -> None:
    assert pod_uids(tmp_path / "absent", set()) == {}
