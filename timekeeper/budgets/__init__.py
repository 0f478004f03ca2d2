"""Budgets, plain data: `periods` and `status` (what was set, what was used, the state), `hierarchy` (group budgets
rolled up, Slurm's Grp* limits), `requests` (the API's bodies checked), `commitments` (what pods with deadlines
committed, for safe admission). The SQL side (writes, the audit log, statuses read in one pass, reservations) is
timekeeper.database.budgets."""
