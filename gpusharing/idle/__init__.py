"""Idle GPUs, plain data: a budget's idle policy and what it says of a pod; read by the timekeeper and the admin command
line."""
