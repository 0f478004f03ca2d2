"""A pod's GPU asks priced on a GPU model (gpusharing/gpu/pricing.py): at admission on the models it names (else the
default), and once bound on its node's, which is what it holds. Memory-denominated asks and MIG profiles cost what
they are of that model; compute fractions and whole GPUs cost the same on any."""

from __future__ import annotations

from typing import Any

import pytest

from demo.apiserver import api_server_pod, example_pod
from gpusharing.gpu.catalogue import PodModels, shipped_catalogue
from gpusharing.gpu.request import GpuRequestSettings, InvalidGpuRequest, parse_gpu_request, read_gpu_asks
from gpusharing.units.share import format_share

CATALOGUE = shipped_catalogue()
A100, T4, H200 = (CATALOGUE.by_name(n) for n in ("NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA H200"))
assert A100 is not None and T4 is not None and H200 is not None and CATALOGUE.default == A100


@pytest.mark.parametrize(
    ("example", "on_default", "on_t4", "on_h200"),
    [
        ("aliyun-gpu-mem.yaml", "0.0625", "0.3334", "0.0357"),  # gpushare: 5 GiB of 80 GiB, 15 GiB, 140 GiB
        ("kai-memory.yaml", "0.0245", "0.1303", "0.014"),  # KAI gpu-memory: 2000 MiB
        ("hami-dynamic-mig.yaml", "0.2858", "2", "0.2858"),  # HAMi gpumem 8000 on 2 devices: a MIG slice, or all a T4
        ("hami-fraction.yaml", "0.3", "0.3", "0.3"),  # gpucores 30 outweighs 3000 MiB on each
        ("vcuda-fraction.yaml", "0.5", "0.5", "0.5"),  # vcuda-core 50 outweighs 15 x 256 MiB
        ("kai-fraction.yaml", "0.5", "0.5", "0.5"),  # a fraction of whatever device it gets
    ],
)
def test_each_dialect_s_request_is_its_share_of_the_model_it_is_priced_on(
    example: str, on_default: str, on_t4: str, on_h200: str
) -> None:
    pod = example_pod(example)
    shares = [format_share(parse_gpu_request(pod, on_model=model).share)  # type: ignore[union-attr]
              for model in (None, T4, H200)]
    assert shares == [on_default, on_t4, on_h200]


def mig_pod(profile: str, product: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "infer", "image": "vllm/vllm-openai",
                                            "resources": {"limits": {f"nvidia.com/mig-{profile}": 1}}}]}
    if product:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": product}
    return api_server_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mig"}, "spec": spec})


def test_an_h200_slice_is_half_a_gpu_on_the_h200_it_is_cut_from_whatever_the_pod_names() -> None:
    # docs/dialects.md: 3g.71gb read on the default A100 80 GB is 7/8 of it; it is half of an H200.
    assert format_share(parse_gpu_request(mig_pod("3g.71gb")).share) == "0.875"  # type: ignore[union-attr]
    assert format_share(parse_gpu_request(mig_pod("3g.71gb"), on_model=H200).share) == "0.5"  # type: ignore[union-attr]
    named = mig_pod("3g.71gb", "NVIDIA-H200")
    assert parse_gpu_request(named).share == parse_gpu_request(named, on_model=H200).share  # type: ignore[union-attr]


def test_the_asks_read_once_price_alike_on_any_model_as_parsing_the_pod_again() -> None:
    settings = GpuRequestSettings()
    for example in ("aliyun-gpu-mem.yaml", "kai-memory.yaml", "hami-dynamic-mig.yaml", "mig-slice.yaml"):
        pod = example_pod(example)
        asks = read_gpu_asks(pod, settings)
        assert asks is not None
        for model in CATALOGUE.models:
            try:
                parsed = parse_gpu_request(pod, settings, on_model=model)
            except InvalidGpuRequest:
                with pytest.raises(InvalidGpuRequest):
                    asks.priced(PodModels((model,), True), settings.dra_devices_per_node)
                continue
            assert asks.priced(PodModels((model,), True), settings.dra_devices_per_node) == parsed


def test_a_request_larger_than_a_device_of_the_model_it_is_priced_on_is_refused_naming_that_model() -> None:
    pod = example_pod("aliyun-gpu-mem.yaml")
    resources = pod["spec"]["containers"][0]["resources"]
    resources["limits"]["aliyun.com/gpu-mem"] = resources["requests"]["aliyun.com/gpu-mem"] = 20  # more than a T4
    assert parse_gpu_request(pod) is not None
    with pytest.raises(InvalidGpuRequest, match="Tesla T4 \\(15360 MiB\\), the pod's GPU model"):
        parse_gpu_request(pod, on_model=T4)


def test_a_pod_that_asks_no_gpu_has_no_asks() -> None:
    pod = api_server_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu"},
                          "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    assert read_gpu_asks(pod) is None and parse_gpu_request(pod, on_model=T4) is None
