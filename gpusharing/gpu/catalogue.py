"""The catalogue of GPU models, and which of them a pod can run on.

A memory request is a fraction of the device it lands on, so the share a pod is billed depends on the device's
model. The catalogue names each model as NVIDIA reports it, with its memory; a pod names the models it may run on
by the GPU operator's node label ``nvidia.com/gpu.product`` (a nodeSelector, or required node affinity) or by HAMi's
``nvidia.com/use-gputype`` annotation, else it gets the catalogue's default model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import yaml

from gpusharing.decoded import as_list, as_mapping
from gpusharing.messages import shortened
from gpusharing.settings.env import ConfigError, env_int
from gpusharing.units.weights import UNIT_WEIGHT, WeightError, parse_weight

PRODUCT_LABEL = "nvidia.com/gpu.product"
HAMI_USE_GPU_TYPE = "nvidia.com/use-gputype"
SHIPPED_CATALOGUE = Path(__file__).with_name("gpu-models.yaml")
MAX_MODELS = 1000
# What a pod may name is read within bounds: a label value has at most 63 characters (the API server refuses longer
# ones after the webhook), and no pod needs more than a few dozen models.
MAX_LABEL = 63
MAX_NAMED = 64
# GPU feature discovery appends these to the product label: the MIG profile under the single MIG strategy
# ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"), and SHARED when time-slicing or MPS replicas are not renamed.
_PRODUCT_SUFFIX = re.compile(r"(?:-MIG-[0-9a-z.+-]+)?(?:-SHARED)?$")


class CatalogueError(ValueError):
    """The catalogue file is not one the webhook can use; the message says what is wrong and where."""


def product_label(name: str) -> str:
    """The `nvidia.com/gpu.product` label the GPU operator gives a node with this model (as it sanitises NVML's
    name)."""
    return "-".join(re.sub(r"[^A-Za-z0-9_. -]", "", name).split())


MIG_COMPUTE_SLICES = (7, 4)  # of a MIG-capable GPU: 7, or 4 on the A30 and the RTX PRO 6000


@dataclass(frozen=True)
class GpuModel:
    """One GPU model of the catalogue: its memory, its MIG compute slices and its billing weight."""

    name: str  # as NVIDIA reports it: "NVIDIA H100 80GB HBM3"
    memory_mib: int
    mig_compute_slices: int = 7
    billing_weight: int = UNIT_WEIGHT  # thousandths (gpusharing.units.weights): what a GPU-second on it is billed as

    @cached_property
    def product(self) -> str:  # once: HAMi's gputype is matched against every model's, each review
        return product_label(self.name)


@dataclass(frozen=True)
class GpuCatalogue:
    """The GPU models a cluster has, and the one a pod that names none is read on."""

    models: tuple[GpuModel, ...]
    default: GpuModel

    def by_product(self, label: str) -> GpuModel | None:
        """The model a node label names, without the suffixes GPU feature discovery adds."""
        if len(label) > MAX_LABEL:
            return None
        return self._products.get(_PRODUCT_SUFFIX.sub("", label, count=1))

    def by_type(self, types: str) -> list[GpuModel]:
        """The models HAMi's `nvidia.com/use-gputype` allows: a comma-separated list, each entry a case-insensitive
        part of the model's name (HAMi's own rule: "A100" allows every A100)."""
        wanted = [
            t.strip().upper() for t in types.split(",", MAX_NAMED)[:MAX_NAMED] if t.strip() and len(t) <= MAX_LABEL
        ]
        return [m for m in self.models if any(w in m.name.upper() or w in m.product.upper() for w in wanted)]

    @cached_property
    def _products(self) -> dict[str, GpuModel]:
        return {m.product: m for m in self.models}

    def by_name(self, name: str) -> GpuModel | None:
        """The model NVIDIA's name (as NVML reports it, or as the webhook recorded it) or its product label names."""
        return self._names.get(name) or self.by_product(product_label(name[:MAX_LABEL * 2]))

    def weight_of(self, name: str | None) -> int:
        """The billing weight of the model a pod was recorded on (the default model's for a name the catalogue
        lacks)."""
        model = self.by_name(name) if name else None
        return (model or self.default).billing_weight

    @cached_property
    def _names(self) -> dict[str, GpuModel]:
        return {m.name: m for m in self.models}

    def with_default_memory(self, memory_mib: int) -> "GpuCatalogue":
        """This catalogue with an unnamed default model of `memory_mib` (GPUSHARING_DEVICE_MEMORY_MIB)."""
        return GpuCatalogue(self.models, GpuModel("default", memory_mib))


def load_catalogue(path: Path) -> GpuCatalogue:
    """The catalogue in the YAML file at `path`; CatalogueError saying what is wrong and where."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as exc:  # ValueError: YAML's reading of a date that is none
        raise CatalogueError(f"cannot read {path}: {exc}") from None
    return catalogue_from(document, str(path))


def catalogue_from_env(environ: Mapping[str, str]) -> GpuCatalogue:
    """GPUSHARING_GPU_MODELS_FILE, else the shipped catalogue, whose default model GPUSHARING_DEVICE_MEMORY_MIB (an
    older setting, still read) may replace by one of that memory. The webhook and the timekeeper read the same file:
    the one divides memory by its models, the other bills by their weights."""
    path = environ.get("GPUSHARING_GPU_MODELS_FILE", "").strip()
    memory = environ.get("GPUSHARING_DEVICE_MEMORY_MIB", "").strip()
    if path and memory:
        raise ConfigError(
            "set GPUSHARING_GPU_MODELS_FILE or GPUSHARING_DEVICE_MEMORY_MIB, not both: the catalogue names its default "
            "model"
        )
    if path:
        try:
            return load_catalogue(Path(path))
        except CatalogueError as exc:
            raise ConfigError(f"GPUSHARING_GPU_MODELS_FILE: {exc}") from None
    if memory:
        return shipped_catalogue().with_default_memory(env_int("GPUSHARING_DEVICE_MEMORY_MIB", 0, 1, environ))
    return shipped_catalogue()


@cache
def shipped_catalogue() -> GpuCatalogue:
    """The catalogue that comes with the package: common datacenter GPUs."""
    return load_catalogue(SHIPPED_CATALOGUE)


def catalogue_from(document: object, where: str) -> GpuCatalogue:
    """The catalogue a decoded YAML document describes; CatalogueError naming `where` and what is wrong."""
    if not isinstance(document, Mapping) or set(document) - {"default", "models"}:
        raise CatalogueError(f"{where}: expected a mapping with `default` and `models` only")
    entries = document.get("models")
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_MODELS:
        raise CatalogueError(f"{where}: `models` must be a list of 1 to {MAX_MODELS} models")
    models = tuple(_model(entry, f"{where}: models[{index}]") for index, entry in enumerate(entries))
    products: dict[str, GpuModel] = {}
    for model in models:
        if model.product in products:
            raise CatalogueError(
                f"{where}: {model.name!r} and {products[model.product].name!r} are the same model ({model.product})"
            )
        products[model.product] = model
    default_name = document.get("default")
    default = next((m for m in models if m.name == default_name), None)
    if default is None:
        raise CatalogueError(
            f"{where}: `default` must be the name of one of the models, got {shortened(str(default_name))!r}"
        )
    return GpuCatalogue(models, default)


def _model(entry: Any, where: str) -> GpuModel:
    if not isinstance(entry, Mapping) or not {"name", "memoryMiB"} <= set(entry) <= {
        "name",
        "memoryMiB",
        "migComputeSlices",
        "billingWeight",
    }:
        raise CatalogueError(
            f"{where}: expected `name`, `memoryMiB` and optionally `migComputeSlices` and `billingWeight`, "
            f"got {shortened(str(entry))}"
        )
    name, memory, slices = entry["name"], entry["memoryMiB"], entry.get("migComputeSlices", 7)
    # Beginning with a letter or digit, as NVIDIA's names do: usage reports' CSV cells then never read as formulas.
    if not isinstance(name, str) or not product_label(name) or not name[:1].isalnum() or not name.isprintable():
        raise CatalogueError(
            f"{where}: `name` must be the model's name as NVIDIA reports it, got {shortened(str(name))!r}"
        )
    if isinstance(memory, bool) or not isinstance(memory, int) or not 1 <= memory <= 2**30:
        raise CatalogueError(
            f"{where}: `memoryMiB` of {name!r} must be a whole number of MiB, got {shortened(str(memory))!r}"
        )
    if slices not in MIG_COMPUTE_SLICES or isinstance(slices, bool):
        raise CatalogueError(f"{where}: `migComputeSlices` of {name!r} must be 7 or 4, got {shortened(str(slices))!r}")
    try:
        weight = parse_weight(entry.get("billingWeight", 1))
    except WeightError as exc:
        raise CatalogueError(f"{where}: `billingWeight` of {name!r} {exc}") from None
    return GpuModel(name, memory, slices, weight)


@dataclass(frozen=True)
class PodModels:
    """The models a pod may land on (never empty), and what the reading assumed on the way."""

    candidates: tuple[GpuModel, ...]
    named: bool  # the pod names its models; False: the catalogue's default
    warnings: tuple[str, ...] = ()


def pod_models(pod: Mapping[str, Any], catalogue: GpuCatalogue, read_gpu_type: bool) -> PodModels:
    """The models a pod may run on: those its required node constraints on `nvidia.com/gpu.product` allow, narrowed
    by HAMi's `nvidia.com/use-gputype` when `read_gpu_type`; the default model when it names none the catalogue has."""
    metadata = as_mapping(pod.get("metadata"))
    spec = as_mapping(pod.get("spec"))
    warnings: list[str] = []
    labels = _required_products(spec)
    by_label: list[GpuModel] | None = None
    if labels is not None:
        by_label = _known(catalogue, labels, f"node constraint {PRODUCT_LABEL}", warnings)
    by_type: list[GpuModel] | None = None
    gpu_type = as_mapping(metadata.get("annotations")).get(HAMI_USE_GPU_TYPE)
    if read_gpu_type and isinstance(gpu_type, str) and gpu_type.strip():
        by_type = catalogue.by_type(gpu_type)
        if not by_type:
            warnings.append(
                f"annotation {HAMI_USE_GPU_TYPE}={shortened(gpu_type)!r} names no model of the GPU model catalogue"
            )
    if by_label and by_type:
        both = [m for m in by_label if m in by_type]
        candidates = both or by_label  # the node constraint is the scheduler's: it wins
    else:
        candidates = by_label or by_type or []
    if not candidates:
        if warnings:
            warnings.append(f"the pod is read as running on the default GPU model, {describe(catalogue.default)}")
        return PodModels((catalogue.default,), False, tuple(warnings))
    return PodModels(tuple(sorted(set(candidates), key=lambda m: (m.memory_mib, m.name))), True, tuple(warnings))


def _required_products(spec: Mapping[str, Any]) -> list[str] | None:
    """The product labels a pod's nodeSelector and required node affinity allow; None when they allow any."""
    allowed: set[str] | None = None
    selected = as_mapping(spec.get("nodeSelector")).get(PRODUCT_LABEL)
    if isinstance(selected, str):
        allowed = {selected}
    required = as_mapping(
        as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    )
    terms = required.get("nodeSelectorTerms")
    if isinstance(terms, list) and terms:
        # Terms are alternatives: the pod is bound to listed products only if every term lists some.
        by_terms: set[str] = set()
        for term in terms:
            values = _term_products(as_mapping(term))
            if values is None:
                by_terms = set()
                break
            by_terms |= values
        if by_terms:
            allowed = by_terms if allowed is None else allowed & by_terms
    return None if allowed is None else sorted(allowed)


def _term_products(term: Mapping[str, Any]) -> set[str] | None:
    found: set[str] | None = None
    for expression in as_list(term.get("matchExpressions")):
        expression = as_mapping(expression)
        values = expression.get("values")
        if expression.get("key") == PRODUCT_LABEL and expression.get("operator") == "In" and isinstance(values, list):
            these = {v for v in values[:MAX_NAMED] if isinstance(v, str)}
            found = these if found is None else found & these  # expressions of one term all hold
    return found


def _known(catalogue: GpuCatalogue, labels: Iterable[str], where: str, warnings: list[str]) -> list[GpuModel]:
    models: list[GpuModel] = []
    for label in labels:
        model = catalogue.by_product(label)
        if model is None:
            warnings.append(f"{where} {shortened(label)!r} is not a model of the GPU model catalogue")
        else:
            models.append(model)
    return models


def describe(model: GpuModel) -> str:
    return f"{model.name} ({model.memory_mib} MiB)"
