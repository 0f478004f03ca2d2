"""parse_gpu_request: every dialect read into one record, and every broken rule named precisely."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from demo.apiserver import api_server_pod, example_manifests, example_pod
from gpusharing.gpu.catalogue import shipped_catalogue
from gpusharing.gpu.request import (
    ContainerRole,
    Dialect,
    GpuRequestSettings,
    InvalidGpuRequest,
    parse_gpu_request,
)
from gpusharing.units.share import format_share


def pod(
    *containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return api_server_pod(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": annotations or {}}, "spec": spec}
    )


def container(
    name: str = "main", limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "image": "ubuntu:22.04", "resources": resources, **extra}


def errors_of(p: dict[str, Any], settings: GpuRequestSettings = GpuRequestSettings()) -> list[str]:
    with pytest.raises(InvalidGpuRequest) as caught:
        parse_gpu_request(p, settings)
    return [str(e) for e in caught.value.errors]


# ---- the examples, as their projects document them -------------------------------------------------------------

EXAMPLES = {
    # file: (dialect, billed share, [(container, role, devices, compute fraction, memory MiB per device)])
    "vcuda-fraction.yaml": ("gpu-manager", "0.5", [("nvidia", "regular", 1, "0.5", 15 * 256)]),
    "vcuda-whole.yaml": ("gpu-manager", "2", [("trainer", "regular", 2, "1", 81920)]),
    "job-fraction.yaml": ("gpu-manager", "0.25", [("eval", "regular", 1, "0.25", 8 * 256)]),
    "hami-fraction.yaml": ("hami", "0.3", [("infer", "regular", 1, "0.3", 3000)]),
    "aliyun-gpu-mem.yaml": ("aliyun-gpushare", "0.0625", [("gpushare-test-pod", "regular", 1, "0.0625", 5 * 1024)]),
    "kai-fraction.yaml": ("kai", "0.5", [("ubuntu", "regular", 1, "0.5", 40960)]),
    "kai-memory.yaml": ("kai", "0.0245", [("ubuntu", "regular", 1, "0.0245", 2000)]),
    "kai-init-container.yaml": ("kai", "0.5", [("gpu-init", "init", 1, "0.5", 40960)]),
    "kai-non-default-container.yaml": ("kai", "0.5", [("gpu-workload", "regular", 1, "0.5", 40960)]),
    "mig-slice.yaml": ("mig", "0.1429", [("infer", "regular", 1, "0.1429", 10240)]),
    "hami-gputype.yaml": ("hami", "0.6956", [("train", "regular", 1, "0.5", 100000)]),
    "hami-dynamic-mig.yaml": ("hami", "0.2858", [("ubuntu-container", "regular", 2, "0.1429", 10240)]),
}


def test_every_example_is_covered() -> None:
    assert set(EXAMPLES) == set(example_manifests())


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_reads_into_one_record(name: str) -> None:
    dialect, share, containers = EXAMPLES[name]
    request = parse_gpu_request(example_pod(name))
    assert request is not None
    assert request.dialect == dialect
    assert format_share(request.share) == share
    assert [
        (c.container, str(c.role), c.devices, format_share(c.compute_fraction), c.memory_mib)
        for c in request.containers
    ] == containers


def test_quantities_arrive_canonicalized_and_are_read_by_value() -> None:
    # The API server sends nvidia.com/gpumem: 3000 as "3k".
    request = parse_gpu_request(pod(container(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3k"})))
    assert request is not None and request.containers[0].memory_mib == 3000


def test_pod_without_gpu_has_no_request() -> None:
    assert parse_gpu_request(pod(container(limits={"cpu": "1", "memory": "1Gi"}))) is None
    assert parse_gpu_request(pod(container(limits={"nvidia.com/gpu": "0"}))) is None


# ---- per dialect ---------------------------------------------------------------------------------------------------


def test_whole_gpus() -> None:
    request = parse_gpu_request(pod(container(limits={"nvidia.com/gpu": "2"})))
    assert request is not None
    assert (request.dialect, request.share, request.containers[0].devices) == (Dialect.WHOLE_GPU, 2, 2)


def test_hami_memory_percentage_and_default_compute() -> None:
    request = parse_gpu_request(pod(container(limits={"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "25"})))
    assert request is not None
    only = request.containers[0]
    # HAMi does not limit compute without gpucores: the pod may use each whole device.
    assert (only.devices, only.compute_fraction, only.memory_mib, request.share) == (2, 1, 20480, 2)


def test_hami_memory_alone_gets_one_device() -> None:
    request = parse_gpu_request(pod(container(limits={"nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "10"})))
    assert request is not None
    assert (request.containers[0].devices, format_share(request.share)) == (1, "0.1")


def test_memory_fraction_bills_when_larger_than_compute() -> None:
    request = parse_gpu_request(
        pod(container(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960", "nvidia.com/gpucores": "10"}))
    )
    assert request is not None and request.share == Decimal("0.5")


def test_device_memory_is_configurable() -> None:
    settings = GpuRequestSettings(catalogue=shipped_catalogue().with_default_memory(24576))
    request = parse_gpu_request(
        pod(container(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "12288", "nvidia.com/gpucores": "10"})),
        settings,
    )
    assert request is not None and request.share == Decimal("0.5")


def test_aliyun_unit_can_be_mib() -> None:
    settings = GpuRequestSettings(aliyun_memory_unit_mib=1)
    request = parse_gpu_request(pod(container(limits={"aliyun.com/gpu-mem": "8192"})), settings)
    assert request is not None and request.containers[0].memory_mib == 8192 and request.share == Decimal("0.1")


def test_kai_num_devices() -> None:
    request = parse_gpu_request(pod(container(), annotations={"gpu-fraction": "0.25", "gpu-fraction-num-devices": "4"}))
    assert request is not None
    assert (request.containers[0].devices, request.share) == (4, 1)


def test_kai_gives_an_init_container_the_fraction_by_its_name() -> None:
    request = parse_gpu_request(
        pod(
            container("app"),
            init=(container("load"),),
            annotations={"gpu-fraction": "0.5", "gpu-fraction-container-name": "load"},
        )
    )
    assert request is not None and (request.containers[0].container, request.containers[0].role) == (
        "load",
        ContainerRole.INIT,
    )


def test_requests_alone_are_read() -> None:
    request = parse_gpu_request(
        pod(container(requests={"tencent.com/vcuda-core": "20", "tencent.com/vcuda-memory": "4"}))
    )
    assert request is not None and request.share == Decimal("0.2")


# ---- the pod's billed share: Kubernetes' effective request ---------------------------------------------------------


def test_regular_containers_add_up() -> None:
    request = parse_gpu_request(
        pod(container("a", limits={"nvidia.com/gpu": "1"}), container("b", limits={"nvidia.com/gpu": "2"}))
    )
    assert request is not None and request.share == 3


def test_init_container_counts_when_larger_than_the_steady_state() -> None:
    request = parse_gpu_request(
        pod(
            container("app", limits={"nvidia.com/gpu": "1"}),
            init=(container("warmup", limits={"nvidia.com/gpu": "4"}),),
        )
    )
    assert request is not None and request.share == 4


def test_native_sidecars_declared_before_an_init_container_add_to_it() -> None:
    sidecar = container("side", limits={"nvidia.com/gpu": "1"}, restartPolicy="Always")
    late = container("late-init", limits={"nvidia.com/gpu": "2"})
    request = parse_gpu_request(pod(container("app"), init=(sidecar, late)))
    assert request is not None
    assert [c.role for c in request.containers] == [ContainerRole.SIDECAR, ContainerRole.INIT]
    assert request.share == 3  # max(2 + 1 sidecar before it, 0 regular + 1 sidecar)


def test_native_sidecars_declared_after_an_init_container_do_not_add_to_it() -> None:
    early = container("early-init", limits={"nvidia.com/gpu": "2"})
    sidecar = container("side", limits={"nvidia.com/gpu": "1"}, restartPolicy="Always")
    request = parse_gpu_request(pod(container("app", limits={"nvidia.com/gpu": "1"}), init=(early, sidecar)))
    assert request is not None and request.share == 2  # max(2, 1 regular + 1 sidecar)


# ---- invalid requests: the exact messages ---------------------------------------------------------------------------

KAI_FRACTION_RULE = (
    "must be a decimal number above 0 and below 1 (a whole GPU is nvidia.com/gpu: 1), "
    "at least 0.0001 (the smallest share billed)"
)
KAI_MEMORY_RULE = "must be a whole number of MiB above 0, in digits only (KAI reads it as an unsigned integer)"

INVALID = [
    # gpu-manager
    (
        pod(container(limits={"tencent.com/vcuda-core": "150", "tencent.com/vcuda-memory": "4"})),
        [
            'container "main": tencent.com/vcuda-core="150": above 99 must be a multiple of 100 (whole GPUs): use 100, '
            '200, ...'
        ],
    ),
    (
        pod(container(limits={"tencent.com/vcuda-core": "50"})),
        [
            'container "main": tencent.com/vcuda-core="50": a fraction of a GPU needs tencent.com/vcuda-memory too '
            '(units of 256 MiB)'
        ],
    ),
    (
        pod(container(limits={"tencent.com/vcuda-memory": "4"})),
        [
            'container "main": tencent.com/vcuda-memory="4": needs tencent.com/vcuda-core above 0: gpu-manager cannot '
            'give GPU memory without GPU compute'
        ],
    ),
    (
        pod(container(limits={"tencent.com/vcuda-core": "500m", "tencent.com/vcuda-memory": "1.5"})),
        [
            'container "main": tencent.com/vcuda-memory="1.5": must be a whole number of 256 MiB units',
            'container "main": tencent.com/vcuda-core="500m": must be a whole number: 1 to 99 (percent of one GPU) or '
            'a multiple of 100 (whole GPUs)',
        ],
    ),
    (
        pod(container(limits={"tencent.com/vcuda-core": "-1", "tencent.com/vcuda-memory": "abc"})),
        [
            'container "main": tencent.com/vcuda-memory="abc": must be a whole number of 256 MiB units',
            'container "main": tencent.com/vcuda-core="-1": must be a whole number: 1 to 99 (percent of one GPU) or a '
            'multiple of 100 (whole GPUs)',
        ],
    ),
    (
        pod(container(limits={"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "400"})),
        [
            'container "main": tencent.com/vcuda-memory="400": asks for 102400 MiB, more than a device has (NVIDIA '
            'A100-SXM4-80GB (81920 MiB), '
            "the default GPU model; a pod names its own by nvidia.com/gpu.product or HAMi's nvidia.com/use-gputype)"
        ],
    ),
    # HAMi
    (
        pod(container(limits={"nvidia.com/gpu": "1.5", "nvidia.com/gpumem": "1024"})),
        ['container "main": nvidia.com/gpu="1.5": must be a whole number of devices'],
    ),
    (
        pod(container(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "101"})),
        [
            'container "main": nvidia.com/gpumem-percentage="101": must be a whole percentage of each device\'s '
            'memory, 0 to 100'
        ],
    ),
    # Aliyun
    (
        pod(container(limits={"aliyun.com/gpu-mem": "0.5"})),
        ['container "main": aliyun.com/gpu-mem="0.5": must be a whole number of GiB'],
    ),
    # KAI (the rules of its own validator: tests/gpusharing/test_backends.py)
    (
        pod(container(), annotations={"gpu-fraction": "abc"}),
        [f'annotation gpu-fraction="abc": {KAI_FRACTION_RULE}'],
    ),
    (
        pod(container(), annotations={"gpu-fraction": "0.5", "gpu-memory": "2000"}),
        [
            'annotation gpu-memory="2000": cannot be set together with gpu-fraction: ask for a fraction or for memory, '
            'not both'
        ],
    ),
    (
        pod(container("app"), annotations={"gpu-fraction": "0.5", "gpu-fraction-container-name": "trainer"}),
        [
            'annotation gpu-fraction-container-name="trainer": names no container or init container of this pod (it '
            'has "app")'
        ],
    ),
    (
        pod(container("app", limits={"nvidia.com/gpu": "1"}), annotations={"gpu-fraction": "0.5"}),
        [
            'annotation gpu-fraction: cannot be combined with an nvidia.com/gpu limit (container "app" sets '
            'nvidia.com/gpu): KAI gives a pod either a fraction of a GPU or whole GPUs'
        ],
    ),
    # every dialect
    (
        pod(
            container(
                limits={"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "4"},
                requests={"tencent.com/vcuda-core": "40"},
            )
        ),
        [
            'container "main": tencent.com/vcuda-core: limit \'50\' and request \'40\' differ; Kubernetes requires an '
            'extended resource\'s request to equal its limit'
        ],
    ),
    (
        pod(
            container("a", limits={"tencent.com/vcuda-core": "100"}),
            container("b", limits={"nvidia.com/gpumem": "1024"}),
        ),
        [
            'pod: mixes GPU-sharing dialects gpu-manager (container "a" sets tencent.com/vcuda-core) and hami '
            '(container "b" sets nvidia.com/gpumem); a pod must use one'
        ],
    ),
    (
        pod(container("a", limits={"aliyun.com/gpu-mem": "2"}), container("b", limits={"nvidia.com/gpu": "1"})),
        [
            'pod: mixes GPU-sharing dialects aliyun-gpushare (container "a" sets aliyun.com/gpu-mem) and whole-gpu '
            '(container "b" sets nvidia.com/gpu); a pod must use one'
        ],
    ),
    (
        pod(container(limits={"aliyun.com/gpu-mem": "2"}), annotations={"gpu-memory": "1000"}),
        [
            'pod: mixes GPU-sharing dialects aliyun-gpushare (container "main" sets aliyun.com/gpu-mem) and kai '
            '(annotation gpu-memory); a pod must use one'
        ],
    ),
    (
        pod(container("m"), init=(container("i", limits={"nvidia.com/gpu": "x"}),)),
        ['init container "i": nvidia.com/gpu="x": must be a whole number of GPUs'],
    ),
    # hostile values: bounded before they are read, refused with the rule
    (
        pod(container(), annotations={"gpu-memory": "1e999999"}),
        [f'annotation gpu-memory="1e999999": {KAI_MEMORY_RULE}'],
    ),
    (
        pod(container(), annotations={"gpu-fraction": "1e-999999999"}),
        [
            'annotation gpu-fraction="1e-999999999": has too many digits or too large an exponent: at most 32 digits '
            'and an exponent from -32 to 32'
        ],
    ),
    (
        pod(container(), annotations={"gpu-fraction": "0.00009"}),
        [f'annotation gpu-fraction="0.00009": {KAI_FRACTION_RULE}'],
    ),
    (
        pod(container(), annotations={"gpu-fraction": "NaN"}),
        [f'annotation gpu-fraction="NaN": {KAI_FRACTION_RULE}'],
    ),
    (
        pod(container(limits={"nvidia.com/gpu": "1e28"})),
        [
            'container "main": nvidia.com/gpu="1e28": asks for 10000000000000000000000000000 GPUs, more than 1000, the '
            'most GPUs one pod may be billed for'
        ],
    ),
    (
        pod(container(limits={"nvidia.com/gpu": "2k"})),
        [
            'container "main": nvidia.com/gpu="2k": asks for 2000 GPUs, more than 1000, the most GPUs one pod may be '
            'billed for'
        ],
    ),
    (
        pod(container(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1" + "0" * 40})),
        [
            'container "main": nvidia.com/gpumem="1'
            + "0" * 40
            + '": has too many digits or too large an exponent: at most 32 digits and an exponent from -32 to 32'
        ],
    ),
    (
        pod(container(limits={"tencent.com/vcuda-core": "200k"})),
        [
            'container "main": tencent.com/vcuda-core="200k": asks for 2000 GPUs, more than 1000, the most GPUs one '
            'pod may be billed for'
        ],
    ),
    (
        pod(container(), annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "1001"}),
        [
            'annotation gpu-fraction-num-devices="1001": asks for 1001 GPUs, more than 1000, the most GPUs one pod may '
            'be billed for'
        ],
    ),
    (
        pod(container("a", limits={"nvidia.com/gpu": "600"}), container("b", limits={"nvidia.com/gpu": "600"})),
        ["pod: is billed for 1200 GPUs in all, more than the 1000 one pod may be"],
    ),
    (
        pod(container("x" * 100, limits={"nvidia.com/gpu": "y" * 100})),
        [
            'container "'
            + "x" * 64
            + '… (100 characters)": nvidia.com/gpu="'
            + "y" * 64
            + '… (100 characters)": must be a whole number of GPUs'
        ],
    ),
]


@pytest.mark.parametrize(("p", "expected"), INVALID, ids=[e[1][0][:60] for e in INVALID])
def test_invalid_request_is_refused_with_a_precise_message(p: dict[str, Any], expected: list[str]) -> None:
    assert errors_of(p) == expected


def test_limit_and_request_may_be_written_differently_but_equal() -> None:
    request = parse_gpu_request(
        pod(
            container(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3k"}, requests={"nvidia.com/gpumem": "3000"})
        )
    )
    assert request is not None and request.containers[0].memory_mib == 3000


def test_malformed_shapes_are_not_a_gpu_request() -> None:
    assert parse_gpu_request({"spec": "nonsense"}) is None
    assert parse_gpu_request({"spec": {"containers": [1, {"resources": []}]}, "metadata": []}) is None


def test_the_limit_of_one_pod_is_admitted() -> None:
    request = parse_gpu_request(pod(container(limits={"nvidia.com/gpu": "1k"})))
    assert request is not None and format_share(request.share) == "1000"


def test_a_tiny_share_is_billed_at_the_smallest_share() -> None:
    for tiny in (
        {"gpu-fraction": "0.0001"},
        {"gpu-fraction": "0.0001000000000000000000000000001"},
        {"gpu-memory": "1"},
    ):
        request = parse_gpu_request(pod(container(), annotations=tiny))
        assert request is not None and format_share(request.share) in ("0.0001", "0.0002")
    exact = parse_gpu_request(pod(container(), annotations={"gpu-fraction": "0.1000000000000000000000000000001"}))
    assert exact is not None and format_share(exact.share) == "0.1001"  # rounded up once, never down first


def test_a_refusal_of_many_containers_lists_ten_rules_and_counts_the_rest() -> None:
    broken = [container(f"c{i}", limits={"nvidia.com/gpu": "x"}) for i in range(25)]
    with pytest.raises(InvalidGpuRequest) as caught:
        parse_gpu_request(pod(*broken))
    assert len(caught.value.errors) == 25
    assert str(caught.value).count("must be a whole number of GPUs") == 10 and str(caught.value).endswith(
        "; and 15 more"
    )


def test_a_pod_of_more_containers_than_the_webhook_reads_is_refused_at_once() -> None:
    many = pod(*[container(f"c{i}") for i in range(900)], init=tuple(container(f"i{i}") for i in range(101)))
    assert errors_of(many) == ["pod: has 1001 containers and init containers, more than the 1000 the webhook reads"]
    assert parse_gpu_request(pod(*[container(f"c{i}") for i in range(1000)])) is None


def test_the_memory_record_follows_the_effective_request_rule_as_the_share_does() -> None:
    # An init container of 40 GiB runs before two regular containers of 8 GiB each: the pod holds 40 GiB at most,
    # not 56 (the sum earlier versions recorded).
    warmup = container(
        "warmup", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960", "nvidia.com/gpucores": "50"}
    )
    app = [
        container(f"app{i}", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "10"})
        for i in range(2)
    ]
    request = parse_gpu_request(pod(*app, init=(warmup,)))
    assert request is not None and (request.memory_mib, request.share) == (40960, Decimal("0.5"))
    sidecar = container(
        "side",
        limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "5"},
        restartPolicy="Always",
    )
    request = parse_gpu_request(pod(*app, init=(sidecar, warmup)))
    assert request is not None and request.memory_mib == 40960 + 4096  # a native sidecar runs beside the init after it
