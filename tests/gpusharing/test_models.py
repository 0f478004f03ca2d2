"""The GPU model catalogue: the shipped one, a file of one's own, and the mistakes a file can hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpusharing.gpu.catalogue import CatalogueError, catalogue_from, load_catalogue, product_label, shipped_catalogue


def test_the_shipped_catalogue_has_the_common_datacenter_gpus_with_nvmls_memory() -> None:
    catalogue = shipped_catalogue()
    memory = {m.product: m.memory_mib for m in catalogue.models}
    assert memory["NVIDIA-A100-SXM4-40GB"] == 40960 and memory["NVIDIA-A100-SXM4-80GB"] == 81920
    assert (
        memory["NVIDIA-H100-80GB-HBM3"] == 81559 and memory["NVIDIA-H200"] == 143771 and memory["NVIDIA-B200"] == 183359
    )
    assert memory["NVIDIA-L40S"] == 46068 and memory["Tesla-T4"] == 15360 and memory["NVIDIA-A10"] == 23028
    assert catalogue.default.product == "NVIDIA-A100-SXM4-80GB"
    assert {m.product: m.mig_compute_slices for m in catalogue.models if m.mig_compute_slices != 7} == {
        "NVIDIA-A30": 4, "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition": 4,
    }


@pytest.mark.parametrize(
    ("label", "product"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),  # GPU feature discovery's sanitise: blanks become '-'
        ("NVIDIA  A100-SXM4-40GB ", "NVIDIA-A100-SXM4-40GB"),
        ("NVIDIA RTX A6000 (rev 1)", "NVIDIA-RTX-A6000-rev-1"),
    ],
)
def test_product_labels_are_the_gpu_operators(label: str, product: str) -> None:
    assert product_label(label) == product


@pytest.mark.parametrize(
    "label",
    [
        "NVIDIA-A100-SXM4-40GB",
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "NVIDIA-A100-SXM4-40GB-SHARED",
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED",
    ],
)
def test_a_product_label_names_its_model_whatever_gpu_feature_discovery_appends(label: str) -> None:
    model = shipped_catalogue().by_product(label)
    assert model is not None and model.name == "NVIDIA A100-SXM4-40GB"


def test_hami_gpu_types_match_by_part_of_the_name_as_hami_does() -> None:
    catalogue = shipped_catalogue()
    assert {m.name for m in catalogue.by_type("a100")} == {
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA A100-PCIE-40GB",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA A100 80GB PCIe",
    }
    assert {m.name for m in catalogue.by_type("H200, ,")} == {"NVIDIA H200", "NVIDIA H200 NVL"}
    assert catalogue.by_type(",") == []


def test_a_catalogue_file_of_ones_own(tmp_path: Path) -> None:
    path = tmp_path / "gpu-models.yaml"
    path.write_text(
        "default: NVIDIA L4\nmodels:\n- name: NVIDIA L4\n  memoryMiB: 23034\n- name: NVIDIA A30\n  memoryMiB: 24576\n  "
        "migComputeSlices: 4\n"
    )
    catalogue = load_catalogue(path)
    assert (catalogue.default.product, catalogue.default.memory_mib, len(catalogue.models)) == ("NVIDIA-L4", 23034, 2)
    assert [m.billing_weight for m in catalogue.models] == [1000, 1000]  # a weight of 1 unless the file says


def test_billing_weights_are_kept_in_thousandths_and_models_found_by_nvidias_name_or_label(tmp_path: Path) -> None:
    path = tmp_path / "gpu-models.yaml"
    path.write_text("default: Tesla T4\nmodels:\n- name: Tesla T4\n  memoryMiB: 15360\n"
                    "- name: NVIDIA H100 80GB HBM3\n  memoryMiB: 81559\n  billingWeight: 4\n"
                    "- name: NVIDIA L4\n  memoryMiB: 23034\n  billingWeight: 1.375\n")
    catalogue = load_catalogue(path)
    assert [m.billing_weight for m in catalogue.models] == [1000, 4000, 1375]
    assert (
        catalogue.by_name("NVIDIA H100 80GB HBM3") is catalogue.by_name("NVIDIA-H100-80GB-HBM3") is catalogue.models[1]
    )
    assert catalogue.by_name("NVIDIA B200") is None and catalogue.by_name("x" * 10_000) is None


BAD: list[tuple[Any, str]] = [
    ([], "f: expected a mapping with `default` and `models` only"),
    ({"default": "x", "models": [], "weights": {}}, "f: expected a mapping with `default` and `models` only"),
    ({"default": "x", "models": []}, "f: `models` must be a list of 1 to 1000 models"),
    (
        {"default": "x", "models": [{"name": "x"}]},
        "f: models[0]: expected `name`, `memoryMiB` and optionally `migComputeSlices` and `billingWeight`",
    ),
    (
        {"default": "x", "models": [{"name": "x", "memoryMiB": "80Gi"}]},
        "f: models[0]: `memoryMiB` of 'x' must be a whole number of MiB, got '80Gi'",
    ),
    (
        {"default": "x", "models": [{"name": "x", "memoryMiB": 0}]},
        "f: models[0]: `memoryMiB` of 'x' must be a whole number of MiB",
    ),
    (
        {"default": "x", "models": [{"name": "x", "memoryMiB": 1, "migComputeSlices": 3}]},
        "f: models[0]: `migComputeSlices` of 'x' must be 7 or 4",
    ),
    (
        {"default": "x", "models": [{"name": "x", "memoryMiB": 1, "billingWeight": 0}]},
        "f: models[0]: `billingWeight` of 'x' must be a number from 0.001 to 1000",
    ),
    (
        {"default": "x", "models": [{"name": "x", "memoryMiB": 1, "billingWeight": 1.0005}]},
        "f: models[0]: `billingWeight` of 'x' must be a number",
    ),
    (
        {"default": "x", "models": [{"name": "x", "memoryMiB": 1, "billingWeight": "4"}]},
        "f: models[0]: `billingWeight` of 'x' must be a number",
    ),
    (
        {"default": "x", "models": [{"name": "x", "memoryMiB": 1, "billingWeight": 1e300}]},
        "f: models[0]: `billingWeight` of 'x' must be a number",
    ),
    (
        {"default": "x", "models": [{"name": "x", "memoryMiB": 1, "billingWeight": float("nan")}]},
        "f: models[0]: `billingWeight` of 'x' must be a number",
    ),
    (
        {"default": "x", "models": [{"name": "x", "memoryMiB": 1, "billingWeight": True}]},
        "f: models[0]: `billingWeight` of 'x' must be a number",
    ),
    (
        {"default": "x", "models": [{"name": "=HYPERLINK(\"x\")", "memoryMiB": 1}]},
        "f: models[0]: `name` must be the model's name as NVIDIA reports it",
    ),
    (
        {"default": "x", "models": [{"name": "Tesla\tT4", "memoryMiB": 1}]},
        "f: models[0]: `name` must be the model's name as NVIDIA reports it",
    ),
    (
        {"default": "x", "models": [{"name": "!!", "memoryMiB": 1}]},
        "f: models[0]: `name` must be the model's name as NVIDIA reports it",
    ),
    (
        {"default": "y", "models": [{"name": "x", "memoryMiB": 1}]},
        "f: `default` must be the name of one of the models, got 'y'",
    ),
    (
        {"default": "a b", "models": [{"name": "a b", "memoryMiB": 1}, {"name": "a  b", "memoryMiB": 2}]},
        "f: 'a  b' and 'a b' are the same model (a-b)",
    ),
]


@pytest.mark.parametrize(("document", "message"), BAD, ids=[m for _, m in BAD])
def test_a_bad_catalogue_is_refused_saying_what_is_wrong(document: Any, message: str) -> None:
    with pytest.raises(CatalogueError) as refused:
        catalogue_from(document, "f")
    assert str(refused.value).startswith(message)


def test_an_unreadable_catalogue_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CatalogueError, match="cannot read"):
        load_catalogue(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("models: [")
    with pytest.raises(CatalogueError, match="cannot read"):
        load_catalogue(tmp_path / "bad.yaml")
