"""The GPU request model and its dialects: what a pod asks of GPUs, read as each sharing backend reads it.

- `request`: `parse_gpu_request`, the one normalized `GpuRequest` of every dialect
- `dialects`: tkestack vcuda, HAMi, Aliyun gpushare, KAI, whole GPUs, each as its backend reads it
- `dra`, `mig`: Dynamic Resource Allocation claims and MIG slices
- `catalogue`: the GPU models a pod can run on (memory, billing weight)
- `reading`: the pod's JSON shapes, read defensively (a pod author controls them)
"""
