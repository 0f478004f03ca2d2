"""Every dialect read as its backend reads it: the pods of the peers' own tests and documentation, with their verdicts.

One table per rule, each citing where the backend says so. A row is a pod and either the share the pod is billed
(the backend admits it) or the refusal (the backend refuses it). Shares are on the default GPU model, the
catalogue's NVIDIA A100-SXM4-80GB (81920 MiB), unless the row says otherwise.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from gpusharing.gpu.catalogue import shipped_catalogue
from gpusharing.gpu.dialects import HamiSettings
from gpusharing.gpu.request import GpuRequestSettings, InvalidGpuRequest, parse_gpu_request
from gpusharing.units.share import format_share
from tests.gpusharing.test_request import container, pod

Verdict = str | None  # the billed share ("0.5"), None for a pod without a GPU, or "refused: <part of the message>"


def verdict(p: dict[str, Any], settings: GpuRequestSettings = GpuRequestSettings()) -> Verdict:
    try:
        request = parse_gpu_request(p, settings)
    except InvalidGpuRequest as exc:
        return f"refused: {exc}"
    return None if request is None else format_share(request.share)


def assert_verdict(p: dict[str, Any], expected: Verdict, settings: GpuRequestSettings = GpuRequestSettings()) -> None:
    actual = verdict(p, settings)
    if expected is not None and expected.startswith("refused: "):
        assert actual is not None and actual.startswith("refused: ") and expected[9:] in actual, actual
    else:
        assert actual == expected


def warnings_of(p: dict[str, Any], settings: GpuRequestSettings = GpuRequestSettings()) -> list[str]:
    request = parse_gpu_request(p, settings)
    assert request is not None
    return list(request.warnings)


def gpu(n: Any) -> dict[str, Any]:
    return {"nvidia.com/gpu": n}


# ---- KAI Scheduler ---------------------------------------------------------------------------------------------------

# pkg/binder/plugins/gpusharing/gpu-request/gpu_request_validator_test.go (TestValidateGpuRequests), in its order.
KAI_VALIDATOR = [
    (
        "allow MPS and fractional GPU limits",
        pod(container(limits={}), annotations={"mps": "true", "gpu-fraction": "0.5"}),
        "0.5",
    ),
    (
        "don't allow MPS and whole gpu limit",
        pod(container(limits=gpu("1")), annotations={"mps": "true"}),
        "refused: annotation mps=\"true\": needs gpu-fraction or gpu-memory: KAI runs MPS only for a fraction of a GPU",
    ),
    (
        "allow MPS and fractional GPU annotation request",
        pod(container(), annotations={"mps": "true", "gpu-fraction": "0.5"}),
        "0.5",
    ),
    (
        "block MPS without GPU request",
        pod(container(), annotations={"mps": "true"}),
        "refused: annotation mps=\"true\": needs gpu-fraction",
    ),
    (
        "forbid GPU annotation and GPU request mismatch (fractional)",
        pod(container(limits=gpu("2m")), annotations={"gpu-fraction": "0.5"}),
        "refused: annotation gpu-fraction: cannot be combined with an nvidia.com/gpu limit",
    ),
    (
        "forbid fraction limit (1500 milli)",
        pod(container(), annotations={"gpu-fraction": "1.5"}),
        "refused: annotation gpu-fraction=\"1.5\": must be a decimal number above 0 and below 1",
    ),
    ("allow whole GPU resource limit of 2", pod(container(limits=gpu("2"))), "2"),
    ("allow whole gpu request of 2, represented as millis", pod(container(limits=gpu("2000m"))), "2"),
    (
        "forbid GPU fraction with GPU memory fraction annotation",
        pod(container(), annotations={"gpu-fraction": "0.5", "gpu-memory": "1"}),
        "refused: annotation gpu-memory=\"1\": cannot be set together with gpu-fraction",
    ),
    (
        "allow multiple containers with whole GPU resource request",
        pod(container("a", limits=gpu("1")), container("b", limits=gpu("2"))),
        "3",
    ),
    (
        "forbid GPU resource limit with GPU memory fraction annotation",
        pod(container(limits=gpu("1m")), annotations={"gpu-memory": "1"}),
        "refused: annotation gpu-memory: cannot be combined with an nvidia.com/gpu limit",
    ),
    (
        "forbid GPU resource limit in sidecar container with GPU memory annotation",
        pod(
            container("DistractionContainer"),
            container("SneakyGPUContainer", limits=gpu("1m")),
            annotations={"gpu-memory": "1"},
        ),
        "refused: (container \"SneakyGPUContainer\" sets nvidia.com/gpu)",
    ),
    (
        "forbid negative GPU memory annotation",
        pod(container(), annotations={"gpu-memory": "-1"}),
        "refused: annotation gpu-memory=\"-1\": must be a whole number of MiB above 0, in digits only",
    ),
    (
        "forbid negative GPU fraction annotation",
        pod(container(), annotations={"gpu-fraction": "-1"}),
        "refused: annotation gpu-fraction=\"-1\": must be a decimal number above 0 and below 1",
    ),
    (
        "forbid GPU fraction which is greater than 1.0",
        pod(container(), annotations={"gpu-fraction": "1.2"}),
        "refused: annotation gpu-fraction=\"1.2\"",
    ),
    (
        "forbid GPU fraction count without fractions or memory",
        pod(container(), annotations={"gpu-fraction-num-devices": "1"}),
        "refused: annotation gpu-fraction-num-devices=\"1\": needs gpu-fraction or gpu-memory",
    ),
    (
        "forbid fraction count that is not an integer",
        pod(container(), annotations={"gpu-fraction-num-devices": "1.2", "gpu-fraction": "0.2"}),
        "refused: annotation gpu-fraction-num-devices=\"1.2\": must be a whole number of devices above 0, in digits "
        "only",
    ),
    (
        "allow GPU fraction count with memory",
        pod(container(), annotations={"gpu-fraction-num-devices": "2", "gpu-memory": "1000"}),
        "0.0245",
    ),
    (
        "allow GPU fraction count with fractions",
        pod(container(), annotations={"gpu-fraction-num-devices": "2", "gpu-fraction": "0.3"}),
        "0.6",
    ),
]

# The validator's parse rules (strconv.ParseFloat / ParseUint) on values the issue names: a whole GPU is not a
# fraction, and KAI's integers are digits only.
KAI_VALUES = [
    (
        "a fraction of 1 is a whole GPU: nvidia.com/gpu: 1",
        {"gpu-fraction": "1"},
        "refused: (a whole GPU is nvidia.com/gpu: 1)",
    ),
    ("a fraction in exponent form", {"gpu-fraction": "5e-1"}, "0.5"),
    (
        "gpu-memory with a suffix",
        {"gpu-memory": "2k"},
        "refused: annotation gpu-memory=\"2k\": must be a whole number of MiB above 0, in digits only",
    ),
    ("gpu-memory of 0", {"gpu-memory": "0"}, "refused: annotation gpu-memory=\"0\""),
    ("gpu-memory with leading zeros", {"gpu-memory": "02048"}, "0.025"),
    (
        "num-devices with a suffix",
        {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2k"},
        "refused: annotation gpu-fraction-num-devices=\"2k\"",
    ),
    (
        "num-devices with a sign",
        {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "+2"},
        "refused: annotation gpu-fraction-num-devices=\"+2\"",
    ),
    ("mps other than \"true\" is not MPS", {"mps": "false"}, None),
    ("a leftover container name without a fraction asks for nothing", {"gpu-fraction-container-name": "main"}, None),
]


def test_mps_is_kais_only_in_a_pod_no_other_sharing_dialect_reads() -> None:
    hami = pod(
        container("main", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "10"}),
        annotations={"mps": "true"},
    )
    assert_verdict(hami, "0.1")


@pytest.mark.parametrize(("name", "p", "expected"), KAI_VALIDATOR, ids=[row[0] for row in KAI_VALIDATOR])
def test_kai_validator(name: str, p: dict[str, Any], expected: Verdict) -> None:
    assert_verdict(p, expected)


@pytest.mark.parametrize(("name", "annotations", "expected"), KAI_VALUES, ids=[row[0] for row in KAI_VALUES])
def test_kai_values(name: str, annotations: dict[str, str], expected: Verdict) -> None:
    assert_verdict(pod(container("main"), annotations=annotations), expected)


# pkg/binder/common/gpu_access.go GetFractionContainerRef, docs/gpu-sharing/*.yaml, CHANGELOG v0.10.2 ("Removed the
# requirement to specify container type for init container gpu fractions"): the named init container, else the
# named container, else the first container; gpu-fraction-container-type is not read.
KAI_TARGET = [
    ("the first container by default", pod(container("main"), container("side")), {}, ("main", "regular")),
    (
        "docs/gpu-sharing/gpu-sharing-non-default-container.yaml",
        pod(container("log-shipper"), container("gpu-workload")),
        {"gpu-fraction-container-name": "gpu-workload"},
        ("gpu-workload", "regular"),
    ),
    (
        "docs/gpu-sharing/gpu-sharing-init-container.yaml",
        pod(container("main-app"), init=(container("gpu-init"),)),
        {"gpu-fraction-container-name": "gpu-init"},
        ("gpu-init", "init"),
    ),
    (
        "v0.10.0-v0.10.1 type without a name: the first container",
        pod(container("app"), init=(container("load"),)),
        {"gpu-fraction-container-type": "InitContainer"},
        ("app", "regular"),
    ),
    (
        "type that disagrees with the name: the name wins",
        pod(container("app")),
        {"gpu-fraction-container-name": "app", "gpu-fraction-container-type": "InitContainer"},
        ("app", "regular"),
    ),
    (
        "a type KAI never had: still not read",
        pod(container("app")),
        {"gpu-fraction-container-type": "Sidecar"},
        ("app", "regular"),
    ),
]


@pytest.mark.parametrize(("name", "p", "annotations", "target"), KAI_TARGET, ids=[row[0] for row in KAI_TARGET])
def test_kai_gives_the_fraction_to_the_container_kai_does(
    name: str, p: dict[str, Any], annotations: dict[str, str], target: tuple[str, str]
) -> None:
    p["metadata"]["annotations"] = {"gpu-fraction": "0.5", **annotations}
    request = parse_gpu_request(p)
    assert request is not None
    (only,) = request.containers
    assert (only.container, str(only.role)) == target
    type_warning = [w for w in request.warnings if "gpu-fraction-container-type" in w]
    assert type_warning == ([
        "annotation gpu-fraction-container-type is ignored: KAI Scheduler dropped it in v0.10.2; the GPU goes to the "
        "container or init container named by gpu-fraction-container-name, else to the first container"
    ] if "gpu-fraction-container-type" in annotations else [])


def test_kai_mps_is_recorded_and_billed_as_the_fraction() -> None:
    # docs/gpu-sharing/mps/gpu-sharing-with-mps.yaml
    request = parse_gpu_request(pod(container("gpu-workload"), annotations={"gpu-fraction": "0.5", "mps": "true"}))
    assert request is not None and request.mps and format_share(request.share) == "0.5"
    assert request.to_dict()["mps"] is True


# ---- HAMi
# --------------------------------------------------------------------------------------------------------------

# pkg/device/nvidia/device_test.go TestGenerateResourceRequests and the rows of its admission tests
# (Test_MutateAdmission_MemoryPercentageValidation, TestMutateAdmissionDefaultsExclusiveCore), with what HAMi grants:
# (devices, memory MiB per device, compute). Without gpucores HAMi limits no compute: billed whole (our policy).
HAMI_REQUESTS = [
    ("gpu count only: 100% memory", {"nvidia.com/gpu": "1"}, "1"),
    ("gpu count + explicit memory", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4096"}, "2"),
    ("gpu count + memory percentage", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}, "1"),
    (
        "gpu count + memory percentage + cores",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "20"},
        "0.5",
    ),
    ("percentage of 100 is accepted", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"}, "1"),
    (
        "percentage of 101 is rejected at admission",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "101"},
        "refused: nvidia.com/gpumem-percentage=\"101\": must be a whole percentage of each device's memory, 0 to 100",
    ),
    (
        "negative percentage is rejected at admission",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "-1"},
        "refused: nvidia.com/gpumem-percentage=\"-1\"",
    ),
    ("gpu count + explicit cores", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50"}, "1"),
    (
        "memory percentage of 0 is unset: the whole card's memory",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "0", "nvidia.com/gpucores": "30"},
        "1",
    ),
    (
        "memory of 0 is unset: the whole card's memory",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "0", "nvidia.com/gpucores": "30"},
        "1",
    ),
    (
        "percentage of 0 + explicit memory: memory wins",
        {
            "nvidia.com/gpu": "1",
            "nvidia.com/gpumem": "2000",
            "nvidia.com/gpumem-percentage": "0",
            "nvidia.com/gpucores": "1",
        },
        "0.0245",
    ),
    (
        "memory and percentage: memory wins",
        {
            "nvidia.com/gpu": "1",
            "nvidia.com/gpumem": "8192",
            "nvidia.com/gpumem-percentage": "50",
            "nvidia.com/gpucores": "10",
        },
        "0.1",
    ),
    (
        "cores above 100 are clamped to 100 at scheduling",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "150"},
        "1",
    ),
    ("memory alone: one device (defaultGPUNum)", {"nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "10"}, "0.1"),
    ("no devices: nothing allocated", {"nvidia.com/gpu": "0", "nvidia.com/gpumem": "8192"}, None),
    (
        "byte-scale memory that overflows HAMi's int32 is rejected",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "16Gi"},
        "refused: nvidia.com/gpumem=\"16Gi\": asks for 17179869184 MiB, more than a device has",
    ),
    (
        "decimal-form memory is rejected",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "16.5"},
        "refused: must be a whole number of MiB per device",
    ),
]


@pytest.mark.parametrize(("name", "limits", "expected"), HAMI_REQUESTS, ids=[row[0] for row in HAMI_REQUESTS])
def test_hami_requests(name: str, limits: dict[str, str], expected: Verdict) -> None:
    assert_verdict(pod(container("main", limits=limits)), expected)


def test_hami_says_what_it_grants_instead_of_what_was_asked() -> None:
    both = pod(
        container(
            "main", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpumem-percentage": "50"}
        )
    )
    assert warnings_of(both) == [
        'container "main": nvidia.com/gpumem-percentage is ignored: HAMi uses nvidia.com/gpumem when both are set'
    ]
    clamped = pod(container("main", limits={"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}))
    assert warnings_of(clamped) == [
        'container "main": nvidia.com/gpucores=150 is more than 100: HAMi grants 100 (the whole device\'s compute)'
    ]
    request = parse_gpu_request(clamped)
    assert request is not None and request.containers[0].compute_fraction == 1


def test_hami_memory_percentage_of_0_books_the_whole_card() -> None:
    # device_test.go TestZeroMemoryPercentageIsAccountedAsWholeCard: the quota counts the whole card's memory
    request = parse_gpu_request(
        pod(
            container(
                "main", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "0", "nvidia.com/gpucores": "10"}
            )
        )
    )
    assert request is not None and (request.memory_mib, request.share) == (81920, 1)


# pkg/scheduler/webhook.go Handle and webhook_test.go: HAMi refuses, for the pods its scheduler takes, a GPU pod
# with a privileged container and one already bound to a node; other schedulers' pods pass.
HAMI_ADMISSION = [
    (
        "privileged container",
        {"containers": [container("main", limits={"nvidia.com/gpumem": "1000"}, securityContext={"privileged": True})]},
        'refused: container "main": securityContext.privileged="true": HAMi refuses a GPU pod with a privileged '
        'container',
    ),
    (
        "privileged init container",
        {
            "containers": [container("main", limits={"nvidia.com/gpumem": "1000"})],
            "initContainers": [container("setup", securityContext={"privileged": True})],
        },
        'refused: init container "setup": securityContext.privileged="true"',
    ),
    (
        "TestPodHasNodeName",
        {"containers": [container("main", limits={"nvidia.com/gpumem": "1000"})], "nodeName": "test-node"},
        'refused: pod: spec.nodeName="test-node": HAMi refuses a GPU pod that is already bound to a node',
    ),
    (
        "TestPodHasDifferentScheduler: not HAMi's to refuse",
        {
            "containers": [
                container("main", limits={"nvidia.com/gpumem": "1000"}, securityContext={"privileged": True})
            ],
            "schedulerName": "different-scheduler",
        },
        "1",
    ),
    (
        "hami-scheduler's own pods",
        {
            "containers": [container("main", limits={"nvidia.com/gpumem": "1000"})],
            "nodeName": "n",
            "schedulerName": "hami-scheduler",
        },
        "refused: spec.nodeName",
    ),
    (
        "unprivileged",
        {
            "containers": [
                container("main", limits={"nvidia.com/gpumem": "1000"}, securityContext={"privileged": False})
            ]
        },
        "1",
    ),
]


def pod_of(spec: dict[str, Any]) -> dict[str, Any]:
    p = pod(*spec["containers"], init=tuple(spec.get("initContainers", ())))
    p["spec"].update({k: v for k, v in spec.items() if k not in ("containers", "initContainers")})
    return p


@pytest.mark.parametrize(("name", "spec", "expected"), HAMI_ADMISSION, ids=[row[0] for row in HAMI_ADMISSION])
def test_hami_admission(name: str, spec: dict[str, Any], expected: Verdict) -> None:
    assert_verdict(pod_of(spec), expected)


# A HAMi installation's own configuration (device ConfigMap `nvidia:`): device_test.go TestGenerateResourceRequests_
# MemoryFactor (1024 × factor 2 = 2048 MiB), _DefaultMemory (512 MiB when none is asked), webhook_test.go
# TestPodHasNodeName (resource names hami.io/*).
HAMI_CONFIG = HamiSettings(
    count="hami.io/gpu",
    memory="hami.io/gpumem",
    memory_percentage="hami.io/gpumem-percentage",
    cores="hami.io/gpucores",
)
HAMI_SETTINGS = [
    (
        "memoryFactor 2",
        HamiSettings(memory_factor=2),
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024", "nvidia.com/gpucores": "1"},
        "0.025",
        2048,
    ),
    (
        "defaultMemory 512",
        HamiSettings(default_memory_mib=512),
        {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "1"},
        "0.01",
        512,
    ),
    (
        "defaultMemory, percentage 0",
        HamiSettings(default_memory_mib=512),
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "0", "nvidia.com/gpucores": "1"},
        "0.01",
        512,
    ),
    (
        "resource names hami.io/*",
        HAMI_CONFIG,
        {"hami.io/gpu": "1", "hami.io/gpumem": "8192", "hami.io/gpucores": "10"},
        "0.1",
        8192,
    ),
    ("hami.io/gpu alone is HAMi's", HAMI_CONFIG, {"hami.io/gpu": "2"}, "2", 2 * 81920),
]


@pytest.mark.parametrize(
    ("name", "hami", "limits", "share", "memory"), HAMI_SETTINGS, ids=[row[0] for row in HAMI_SETTINGS]
)
def test_hami_follows_the_installations_configuration(
    name: str, hami: HamiSettings, limits: dict[str, str], share: str, memory: int
) -> None:
    request = parse_gpu_request(pod(container("main", limits=limits)), GpuRequestSettings(hami=hami))
    assert request is not None and str(request.dialect) == "hami"
    assert (format_share(request.share), request.memory_mib) == (share, memory)


def test_with_hami_renamed_nvidia_com_gpu_is_a_whole_gpu() -> None:
    request = parse_gpu_request(
        pod(container("main", limits={"nvidia.com/gpu": "1"})), GpuRequestSettings(hami=HAMI_CONFIG)
    )
    assert request is not None and str(request.dialect) == "whole-gpu"


# ---- tkestack gpu-manager --------------------------------------------------------------------------------------------

# gpu-admission pkg/util/util.go IsGPURequiredContainer: a container asks for a GPU when vcuda-core > 0 and, below
# 100, vcuda-memory > 0; gpu-manager README: vcuda-core is below 100 or a multiple of 100.
GPU_MANAGER = [
    (
        "core 0 and memory 0: no GPU (Helm charts template 0)",
        {"tencent.com/vcuda-core": "0", "tencent.com/vcuda-memory": "0"},
        None,
    ),
    ("core 0 alone: no GPU", {"tencent.com/vcuda-core": "0"}, None),
    ("memory 0 alone: no GPU", {"tencent.com/vcuda-memory": "0"}, None),
    (
        "core 0 with memory: memory without compute",
        {"tencent.com/vcuda-core": "0", "tencent.com/vcuda-memory": "4"},
        "refused: tencent.com/vcuda-memory=\"4\": needs tencent.com/vcuda-core above 0",
    ),
    ("README: 0.3 GPU, 7680 MiB", {"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "30"}, "0.5"),
    ("README: 100, 200 and 20 are valid", {"tencent.com/vcuda-core": "200"}, "2"),
    ("README: 150 is invalid", {"tencent.com/vcuda-core": "150"}, "refused: above 99 must be a multiple of 100"),
    ("README: 250 is invalid", {"tencent.com/vcuda-core": "250"}, "refused: above 99 must be a multiple of 100"),
    (
        "a fraction without memory",
        {"tencent.com/vcuda-core": "20"},
        "refused: a fraction of a GPU needs tencent.com/vcuda-memory too",
    ),
]


@pytest.mark.parametrize(("name", "limits", "expected"), GPU_MANAGER, ids=[row[0] for row in GPU_MANAGER])
def test_gpu_manager(name: str, limits: dict[str, str], expected: Verdict) -> None:
    assert_verdict(pod(container("nvidia", limits=limits)), expected)


def test_a_helm_chart_that_templates_0_for_its_other_containers_is_billed_for_the_one_that_asks() -> None:
    chart = pod(
        container("model", limits={"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "30"}),
        container("proxy", limits={"tencent.com/vcuda-core": "0", "tencent.com/vcuda-memory": "0"}),
    )
    request = parse_gpu_request(chart)
    assert (
        request is not None
        and [c.container for c in request.containers] == ["model"]
        and request.share == Decimal("0.5")
    )


# gpu-manager README and pkg/services/virtual-manager/manager.go: the annotation tencent.com/vcuda-core-limit lets a
# fraction use up to that percent (soft limit), read with strconv.Atoi and capped at 100. Billed: vcuda-core.
VCUDA_CORE_LIMIT = [
    ("README: 0.3 GPU with 0.5 limit", "50", "0.3", "0.5"),
    ("capped at 100", "150", "0.3", "1"),
    (
        "not a number: the container cannot start",
        "half",
        "refused: annotation tencent.com/vcuda-core-limit=\"half\": must be a whole percentage",
        None,
    ),
    ("negative", "-5", "refused: annotation tencent.com/vcuda-core-limit=\"-5\"", None),
]


@pytest.mark.parametrize(
    ("name", "limit", "expected", "recorded"), VCUDA_CORE_LIMIT, ids=[row[0] for row in VCUDA_CORE_LIMIT]
)
def test_vcuda_core_limit_is_recorded_not_billed(
    name: str, limit: str, expected: Verdict, recorded: str | None
) -> None:
    p = pod(
        container("nvidia", limits={"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "30"}),
        annotations={"tencent.com/vcuda-core-limit": limit},
    )
    assert_verdict(p, expected)
    if recorded is not None:
        request = parse_gpu_request(p)
        assert request is not None and request.containers[0].to_dict()["computeLimit"] == recorded


# ---- Aliyun gpushare and ACK -----------------------------------------------------------------------------------------

# gpushare-scheduler-extender pkg/utils/pod.go (GetGPUMemoryFromPodResource sums the containers; IsGPUsharingPod:
# above 0) and pkg/cache/nodeinfo.go (Assume: the sum must fit one device's free memory); samples/*.yaml; ACK's
# "multi-GPU sharing" (label aliyun.com/gpu-count: N GiB over M GPUs, N/M whole) and "allocate computing power"
# (aliyun.com/gpu-core.percentage: a multiple of 5 from 5 to 100, with GPU memory, not with multi-GPU sharing).
ALIYUN = [
    ("samples/1.yaml: 2 GiB", [{"aliyun.com/gpu-mem": "2"}], {}, "0.025"),
    ("0 GiB: not a sharing pod", [{"aliyun.com/gpu-mem": "0"}], {}, None),
    ("a container of 0 beside one of 3", [{"aliyun.com/gpu-mem": "3"}, {"aliyun.com/gpu-mem": "0"}], {}, "0.0375"),
    (
        "the pod's memory on one device: 2 × 50 GiB",
        [{"aliyun.com/gpu-mem": "50"}, {"aliyun.com/gpu-mem": "50"}],
        {},
        "refused: pod: aliyun.com/gpu-mem: asks for 102400 MiB over its containers, more than a device has",
    ),
    ("ACK multi-GPU: 8 GiB over 2 GPUs", [{"aliyun.com/gpu-mem": "8"}], {"aliyun.com/gpu-count": "2"}, "0.1"),
    ("ACK multi-GPU: 120 GiB over 2 GPUs fits", [{"aliyun.com/gpu-mem": "120"}], {"aliyun.com/gpu-count": "2"}, "1.5"),
    (
        "ACK multi-GPU: N/M must be whole",
        [{"aliyun.com/gpu-mem": "5"}],
        {"aliyun.com/gpu-count": "2"},
        'refused: container "c0": aliyun.com/gpu-mem="5": ACK shares it over the 2 GPUs of label aliyun.com/gpu-count '
        'evenly: it must divide by 2',
    ),
    (
        "ACK multi-GPU: a card holds what a card is given",
        [{"aliyun.com/gpu-mem": "100"}, {"aliyun.com/gpu-mem": "100"}],
        {"aliyun.com/gpu-count": "2"},
        "refused: pod: aliyun.com/gpu-mem: asks for 102400 MiB over its containers, more than a device has",
    ),
    (
        "ACK multi-GPU: a count of 0",
        [{"aliyun.com/gpu-mem": "4"}],
        {"aliyun.com/gpu-count": "0"},
        "refused: label aliyun.com/gpu-count=\"0\": must be a whole number of GPUs, at least 1",
    ),
    (
        "ACK computing power: 30% and 3 GiB",
        [{"aliyun.com/gpu-mem": "3", "aliyun.com/gpu-core.percentage": "30"}],
        {},
        "0.3",
    ),
    (
        "ACK computing power: memory dominates",
        [{"aliyun.com/gpu-mem": "60", "aliyun.com/gpu-core.percentage": "5"}],
        {},
        "0.75",
    ),
    (
        "ACK computing power: not a multiple of 5",
        [{"aliyun.com/gpu-mem": "3", "aliyun.com/gpu-core.percentage": "33"}],
        {},
        "refused: aliyun.com/gpu-core.percentage=\"33\": must be a multiple of 5 from 5 to 100",
    ),
    (
        "ACK computing power: without memory",
        [{"aliyun.com/gpu-core.percentage": "30"}],
        {},
        "refused: aliyun.com/gpu-core.percentage=\"30\": needs aliyun.com/gpu-mem",
    ),
    (
        "ACK computing power: not with multi-GPU sharing",
        [{"aliyun.com/gpu-mem": "8", "aliyun.com/gpu-core.percentage": "30"}],
        {"aliyun.com/gpu-count": "2"},
        "refused: cannot be combined with label aliyun.com/gpu-count",
    ),
]


@pytest.mark.parametrize(("name", "limits", "labels", "expected"), ALIYUN, ids=[row[0] for row in ALIYUN])
def test_aliyun(name: str, limits: list[dict[str, str]], labels: dict[str, str], expected: Verdict) -> None:
    p = pod(*[container(f"c{i}", limits=each) for i, each in enumerate(limits)])
    p["metadata"]["labels"] = labels
    assert_verdict(p, expected)


# ---- MIG -------------------------------------------------------------------------------------------------------------

# NVIDIA k8s-device-plugin internal/rm/rm.go (mixed strategy: nvidia.com/mig-<profile>, '+' written '.', only GPU
# instance profiles), go-nvlib mig_profile.go (attributes me, me.all, gfx, -me), HAMi examples/nvidia/mig_example.yaml,
# NVIDIA's MIG user guide (fractions of memory and SMs per profile). Billed max(g/7, memory eighths/8) per slice.
MIG = [
    ("HAMi mig_example.yaml: 3g.20gb on an A100-40GB", "nvidia.com/mig-3g.20gb", "NVIDIA-A100-SXM4-40GB", "0.5"),
    ("1g.5gb on an A100-40GB: 1/7 compute, 1/8 memory", "nvidia.com/mig-1g.5gb", "NVIDIA-A100-SXM4-40GB", "0.1429"),
    ("1g.10gb on an A100-40GB: 2/8 memory", "nvidia.com/mig-1g.10gb", "NVIDIA-A100-SXM4-40GB", "0.25"),
    ("1g.10gb on an H100: 1/8 memory", "nvidia.com/mig-1g.10gb", "NVIDIA-H100-80GB-HBM3", "0.1429"),
    ("1g.20gb on an H100", "nvidia.com/mig-1g.20gb", "NVIDIA-H100-80GB-HBM3", "0.25"),
    ("4g.40gb on an H100", "nvidia.com/mig-4g.40gb", "NVIDIA-H100-80GB-HBM3", "0.5715"),
    ("7g.80gb on an H100 (79.6 GiB): the whole GPU", "nvidia.com/mig-7g.80gb", "NVIDIA-H100-80GB-HBM3", "1"),
    ("media extensions (1g.10gb+me)", "nvidia.com/mig-1g.10gb.me", "NVIDIA-H100-80GB-HBM3", "0.1429"),
    ("3g.71gb on an H200", "nvidia.com/mig-3g.71gb", "NVIDIA-H200", "0.5"),
    ("1g.23gb on a B200", "nvidia.com/mig-1g.23gb", "NVIDIA-B200", "0.1429"),
    ("A30 (4 compute slices): 1g.6gb", "nvidia.com/mig-1g.6gb", "NVIDIA-A30", "0.25"),
    ("A30: 2g.12gb", "nvidia.com/mig-2g.12gb", "NVIDIA-A30", "0.5"),
    (
        "a compute-instance profile the device plugin does not advertise",
        "nvidia.com/mig-1c.2g.20gb",
        "NVIDIA-H100-80GB-HBM3",
        "refused: nvidia.com/mig-1c.2g.20gb: names a compute-instance profile, which the NVIDIA device plugin does not "
        "advertise",
    ),
    (
        "5g is not a GPU instance size",
        "nvidia.com/mig-5g.50gb",
        "NVIDIA-H100-80GB-HBM3",
        "refused: nvidia.com/mig-5g.50gb: is not a MIG profile",
    ),
    (
        "not a profile at all",
        "nvidia.com/mig-large",
        "NVIDIA-H100-80GB-HBM3",
        "refused: nvidia.com/mig-large: is not a MIG profile",
    ),
]


@pytest.mark.parametrize(("name", "resource", "product", "expected"), MIG, ids=[row[0] for row in MIG])
def test_mig_slices(name: str, resource: str, product: str, expected: Verdict) -> None:
    p = pod(container("main", limits={resource: "1"}))
    p["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": product}
    assert_verdict(p, expected)


def test_mig_slices_beside_whole_gpus_and_their_record() -> None:
    p = pod(container("a", limits={"nvidia.com/mig-1g.10gb": "2"}), container("b", limits={"nvidia.com/gpu": "1"}))
    request = parse_gpu_request(p)
    assert request is not None and str(request.dialect) == "mig"
    assert format_share(request.share) == "1.2858"  # 2 × 1/7 + 1
    assert request.containers[0].to_dict()["migProfile"] == "1g.10gb"
    assert request.memory_mib == 2 * 10240 + 81920
    assert_verdict(pod(container("a", limits={"nvidia.com/mig-1g.10gb": "0"})), None)


# HAMi examples/nvidia/dynamic_mig_example.yaml and pkg/device/nvidia/device.go selectMigCandidate: in `mig` mode HAMi
# carves, on each device, the smallest allowed profile (charts/hami device-configmap migProfileAllowlist: 1g, 2g,
# 3g, 7g) that holds the memory asked: "2 × 8000 MiB is 2g.10gb × 2 on an A100-40GB, 1g.10gb × 2 on an A100-80GB".
HAMI_DYNAMIC_MIG = [
    (
        "dynamic_mig_example.yaml on an A100-40GB: 2 × 2g.10gb",
        "A100-SXM4-40GB",
        {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000"},
        "0.5715",
        "2g.10gb",
    ),
    (
        "dynamic_mig_example.yaml on an A100-80GB: 2 × 1g.10gb",
        "A100-SXM4-80GB",
        {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000"},
        "0.2858",
        "1g.10gb",
    ),
    (
        "the whole memory: the whole GPU (7g)",
        "H100",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"},
        "1",
        "7g.79gb",
    ),
    (
        "a percentage: half the memory is 3g",
        "H100",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "40"},
        "0.5",
        "3g.39gb",
    ),
    (
        "A30 (4 slices): 5000 MiB is 1g.6gb",
        "A30",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5000"},
        "0.25",
        "1g.6gb",
    ),
]


@pytest.mark.parametrize(
    ("name", "gpu_type", "limits", "share", "profile"), HAMI_DYNAMIC_MIG, ids=[row[0] for row in HAMI_DYNAMIC_MIG]
)
def test_hami_dynamic_mig(name: str, gpu_type: str, limits: dict[str, str], share: str, profile: str) -> None:
    p = pod(
        container("main", limits=limits),
        annotations={"nvidia.com/vgpu-mode": "mig", "nvidia.com/use-gputype": gpu_type},
    )
    request = parse_gpu_request(p)
    assert request is not None
    assert (format_share(request.share), request.containers[0].mig_profile) == (share, profile)


def test_hami_mode_that_allows_mig_or_hami_core_is_billed_the_larger() -> None:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "5"}
    shared = parse_gpu_request(pod(container("main", limits=limits)))
    either = parse_gpu_request(
        pod(container("main", limits=limits), annotations={"nvidia.com/vgpu-mode": "mig,hami-core"})
    )
    assert shared is not None and either is not None
    assert format_share(shared.share) == "0.0977" and format_share(either.share) == "0.1429"


# ---- GPU models
# -------------------------------------------------------------------------------------------------------

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200"}


def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
            }
        }
    }


def product_in(*values: str) -> dict[str, Any]:
    return {"key": "nvidia.com/gpu.product", "operator": "In", "values": list(values)}


# A request that fits a larger GPU is admitted on it, and memory divides by the memory of the GPU it runs on.
# HAMi pkg/device/devices.go CheckType (devices_test.go TestCheckType: "A100,V100" matches NVIDIA-A100 by substring).
MODELS = [
    (
        "120000 MiB on the default A100-80GB",
        {},
        {},
        {},
        "refused: asks for 120000 MiB, more than a device has (NVIDIA A100-SXM4-80GB (81920 MiB), the default GPU "
        "model",
    ),
    ("120000 MiB on an H200 by nodeSelector", {"nodeSelector": H200}, {}, {}, "0.8347"),
    ("120000 MiB by required affinity", {"affinity": affinity([product_in("NVIDIA-H200")])}, {}, {}, "0.8347"),
    ("by HAMi's use-gputype", {}, {"nvidia.com/use-gputype": "H200"}, {}, "0.8347"),
    (
        "use-gputype of several: billed on the smallest that holds it",
        {},
        {"nvidia.com/use-gputype": "H200,B200"},
        {},
        "0.8347",
    ),
    (
        "affinity of several: the smallest that holds it",
        {"affinity": affinity([product_in("NVIDIA-B200", "NVIDIA-H200", "NVIDIA-A100-SXM4-80GB")])},
        {},
        {},
        "0.8347",
    ),
    (
        "several, none holds it: refused on the largest",
        {"affinity": affinity([product_in("NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S")])},
        {},
        {},
        "refused: more than a device has (NVIDIA A100-SXM4-80GB (81920 MiB), the largest GPU model the pod may run on)",
    ),
    (
        "a term without the product allows any: the default",
        {"affinity": affinity([product_in("NVIDIA-H200")], [])},
        {},
        {},
        "refused: the default GPU model",
    ),
    (
        "GPU feature discovery's SHARED suffix",
        {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200-SHARED"}},
        {},
        {},
        "0.8347",
    ),
]


@pytest.mark.parametrize(("name", "spec", "annotations", "_", "expected"), MODELS, ids=[row[0] for row in MODELS])
def test_gpu_models(name: str, spec: dict[str, Any], annotations: dict[str, str], _: Any, expected: Verdict) -> None:
    p = pod(
        container("main", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "120000", "nvidia.com/gpucores": "10"}),
        annotations=annotations,
    )
    p["spec"].update(spec)
    assert_verdict(p, expected)


def test_a_model_the_catalogue_does_not_have_is_read_as_the_default_with_a_warning() -> None:
    p = pod(
        container("main", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "1"}),
        annotations={"nvidia.com/use-gputype": "V100S"},
    )
    p["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "Tesla-P4"}
    request = parse_gpu_request(p)
    assert request is not None and request.model == "NVIDIA A100-SXM4-80GB" and format_share(request.share) == "0.1"
    assert request.warnings == (
        "node constraint nvidia.com/gpu.product 'Tesla-P4' is not a model of the GPU model catalogue",
        "annotation nvidia.com/use-gputype='V100S' names no model of the GPU model catalogue",
        "the pod is read as running on the default GPU model, NVIDIA A100-SXM4-80GB (81920 MiB)",
    )


def test_use_gputype_is_hamis_only() -> None:
    kai = pod(container("main"), annotations={"gpu-memory": "120000", "nvidia.com/use-gputype": "H200"})
    assert_verdict(kai, "refused: the default GPU model")


def test_the_model_divides_every_dialects_memory() -> None:
    l4 = {"nvidia.com/gpu.product": "NVIDIA-L4"}  # 23034 MiB
    for p, share in [
        (pod(container(limits={"tencent.com/vcuda-core": "10", "tencent.com/vcuda-memory": "45"})), "0.5002"),
        (pod(container(limits={"aliyun.com/gpu-mem": "11"})), "0.4891"),
        (pod(container(), annotations={"gpu-memory": "11517"}), "0.5"),
    ]:
        p["spec"]["nodeSelector"] = l4
        assert_verdict(p, share)
    kai = pod(container(), annotations={"gpu-fraction": "0.5"})
    kai["spec"]["nodeSelector"] = l4
    request = parse_gpu_request(kai)
    assert request is not None and request.memory_mib == 11517


def test_gpusharing_device_memory_mib_still_names_the_default_models_memory() -> None:
    settings = GpuRequestSettings(catalogue=shipped_catalogue().with_default_memory(24576))
    request = parse_gpu_request(
        pod(container(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "12288", "nvidia.com/gpucores": "10"})),
        settings,
    )
    assert request is not None and request.share == Decimal("0.5") and request.model == "default"


def test_what_a_pod_names_of_models_is_read_within_bounds() -> None:
    # Hostile lists: only the first 64 values of a term or of use-gputype are read, values longer than a label never.
    p = pod(container("main", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "1"}),
            annotations={"nvidia.com/use-gputype": ",".join(["V999"] * 100_000 + ["H200"])})
    p["spec"]["affinity"] = affinity([product_in(*(["Tesla-P4"] * 100_000), "NVIDIA-H200")])
    p["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H200" + "-" * 100}
    request = parse_gpu_request(p)
    assert request is not None and request.model == "NVIDIA A100-SXM4-80GB"
