"""The Kubernetes API as the services reach it: the official client from a kubeconfig or in-cluster (`client`), and
objects kept in memory by a LIST and a WATCH (`watching`, the informer pattern)."""
