"""Fair share among namespaces in budget, plain data: usage decayed exactly from the ledger's intervals
(`decay`), Slurm's Fair Tree over the budget hierarchy (`tree`), and the priority band each namespace's new pods get
(`bands`). docs/fair-share.md tells how they fit together."""
