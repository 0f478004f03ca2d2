"""The timekeeper in the cluster: the Kubernetes API through the official client (`kube`), the leader's Lease
(`leader`), the controller that syncs GPUBudget resources and demotes what is over budget (`controller`, `resources`,
`demotion`), and the GPU pods followed by a watch for safe admission (`pods`)."""
