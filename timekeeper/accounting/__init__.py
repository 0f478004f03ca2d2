"""Accounting, plain data: a pod's bill exactly once from the API server's record and its meter's reports (`ledger`),
the record read from the pod (`record`), and per-pod GPU utilisation from DCGM's series in Prometheus (`dcgm`). The SQL
side (the ledger's rows, the report queue, usage reports, billing weights) is timekeeper.database.accounting."""
