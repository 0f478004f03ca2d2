"""The GPU request model and its dialects: what a pod asks of GPUs, read as each sharing backend reads it.

- `request`: `parse_gpu_request`, the one normalized `GpuRequest` of every dialect
- `dialects`: what every dialect reads into, and tkestack vcuda, HAMi and Aliyun gpushare, each as its backend reads it
- `nvidia`: NVIDIA's own dialects, whole GPUs and MIG slices of the device plugin and KAI Scheduler's fractions
- `dra`, `claims`, `mig`: Dynamic Resource Allocation claims, priced, and MIG slices
- `catalogue`: the GPU models a pod can run on (memory, billing weight)
- `fields`: what every dialect's reader shares: the pod's containers, bounded numbers, the errors found
"""
