"""Accounting: meter reports into the ledger exactly once (`ledger`, the plain arithmetic; `reports`, its SQL side and
the report queue), what each pod was charged per day and the usage reports over it (`usage`), and the GPU models'
billing weights with their audit log (`weights`)."""
