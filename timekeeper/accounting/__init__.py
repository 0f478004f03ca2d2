"""Accounting: meter reports into the ledger exactly once (`ledger`, the plain arithmetic; `reports`, its SQL side and
the report queue), what each pod was charged per day and the usage reports over it (`usage`; the request, the CSV and
the pod labels, plain, in `usage_report`), and the GPU models' billing weights with their audit log (`weights`)."""
