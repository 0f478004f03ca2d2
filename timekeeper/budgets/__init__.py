"""Budgets: `periods` and `status` (plain arithmetic: what was set, what was used, the state), `hierarchy` (group
budgets rolled up, Slurm's Grp* limits), `requests` (the API's bodies checked), `commitments` (what pods with
deadlines committed, for safe admission), and the SQL side: `store` (writes and the audit log) and `reads` (statuses
read in one pass)."""
