"""Units the services agree on, bounded before any arithmetic: Kubernetes quantities (`quantity`), the billed GPU
share (`share`), and billing weights with the micro-GPU-second counts charges are kept in (`weights`)."""
