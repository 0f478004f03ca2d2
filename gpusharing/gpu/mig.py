"""NVIDIA Multi-Instance GPU (MIG) slices, as the NVIDIA device plugin names them and as HAMi carves them.

A MIG-capable GPU has 7 compute slices (4 on the A30 and the RTX PRO 6000: the model's `migComputeSlices`) and 8
memory slices. A profile `<g>g.<n>gb` takes g compute slices and the memory slices that hold n GB. The memory in the
name is rounded, so the memory share is counted in eighths of the device's memory: a slice is billed
`max(g / compute slices, memory eighths / 8)` of a GPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
MEMORY_SLICES = 8
GPU_INSTANCE_SIZES = (1, 2, 3, 4, 7)
# The device plugin writes the profile's attributes with '.' for '+' (a resource name has no '+'):
# 1g.10gb+me is nvidia.com/mig-1g.10gb.me. It exposes only profiles whose compute instance spans the GPU instance.
_RESOURCE = re.compile(r"(?P<g>[0-9]{1,2})g\.(?P<gb>[0-9]{1,4})gb(?P<attributes>\.me|\.me\.all|\.gfx|-me)?")
_COMPUTE_INSTANCE = re.compile(r"[0-9]{1,2}c\.[0-9]{1,2}g\.[0-9]{1,4}gb.*")
# The profiles HAMi's dynamic MIG may carve by default (its chart's migProfileAllowlist: 1g, 2g, 3g and 7g of a
# 7-slice GPU; 1g, 2g and 4g of a 4-slice one), in (compute slices, memory eighths), smallest memory first: HAMi
# takes the first that holds the request.
_HAMI_GEOMETRY = {7: ((1, 1), (2, 2), (3, 4), (7, 8)), 4: ((1, 2), (2, 4), (4, 8))}


class InvalidMigProfile(ValueError):
    """Not a MIG resource the NVIDIA device plugin advertises; the message says what the name must look like."""


@dataclass(frozen=True)
class MigSlice:
    """One MIG GPU instance: its compute slices and its memory."""

    compute_slices: int
    memory_mib: int
    profile: str

    def compute(self, device_compute_slices: int) -> Decimal:
        return min(Decimal(1), Decimal(self.compute_slices) / device_compute_slices)

    def memory(self, device_memory_mib: int) -> Decimal:
        """The share of the device's memory, in whole eighths (never none, never more than all)."""
        eighths = min(MEMORY_SLICES, max(1, round(MEMORY_SLICES * self.memory_mib / device_memory_mib)))
        return Decimal(eighths) / MEMORY_SLICES

    def share(self, device_compute_slices: int, device_memory_mib: int) -> Decimal:
        return max(self.compute(device_compute_slices), self.memory(device_memory_mib))


def is_mig_resource(key: str) -> bool:
    return key.startswith(MIG_RESOURCE_PREFIX)


def mig_profile(resource: str) -> MigSlice:
    """The slice a `nvidia.com/mig-<g>g.<n>gb[.me|.me.all|.gfx|-me]` resource gives, or InvalidMigProfile."""
    return parse_profile(resource.removeprefix(MIG_RESOURCE_PREFIX))


def parse_profile(profile: str) -> MigSlice:
    """The slice a profile name gives (`1g.10gb`, `1g.10gb.me`; NVIDIA's `1g.10gb+me` too), or InvalidMigProfile."""
    profile = profile.replace("+", ".")
    if _COMPUTE_INSTANCE.fullmatch(profile):
        raise InvalidMigProfile(
            "names a compute-instance profile, which the NVIDIA device plugin does not advertise: "
            "ask for the GPU instance profile, <g>g.<n>gb"
        )
    match = _RESOURCE.fullmatch(profile)
    if match is None or int(match["g"]) not in GPU_INSTANCE_SIZES or int(match["gb"]) == 0:
        raise InvalidMigProfile(
            "is not a MIG profile: <g>g.<n>gb with g one of 1, 2, 3, 4, 7 and n its memory in GB, as in "
            "nvidia.com/mig-1g.10gb or nvidia.com/mig-3g.40gb (with media extensions: nvidia.com/mig-1g.10gb.me)"
        )
    return MigSlice(int(match["g"]), int(match["gb"]) * 1024, profile)


def dynamic_slice(memory_mib: int, device_compute_slices: int, device_memory_mib: int) -> MigSlice:
    """The slice HAMi's dynamic MIG carves for `memory_mib`: the smallest allowed profile that holds it."""
    needed = math.ceil(MEMORY_SLICES * memory_mib / device_memory_mib)
    for compute_slices, eighths in _HAMI_GEOMETRY[device_compute_slices]:
        if eighths >= needed:
            memory = device_memory_mib * eighths // MEMORY_SLICES
            return MigSlice(compute_slices, memory, f"{compute_slices}g.{memory // 1024}gb")
    raise ValueError(f"{memory_mib} MiB is more than a device of {device_memory_mib} MiB")
