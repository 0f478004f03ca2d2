"""The core shared by the webhook, the timekeeper, the meter and the command line, importing none of them.

`gpu` (the GPU request model and its dialects), `units` (quantities, shares, weights), `kube` (the Kubernetes client
and watches), `serving` (gunicorn, TLS, JSON bodies, logging, metrics), `settings` (environment and arguments), and
the contracts between the roles: `contract` (annotations, states, modes, periods), `report` (the meter's report),
`listing` (the timekeeper's budget listing), `idle` and `fairshare` (read on both sides), `commitment` (what a pod with
a deadline commits), `thresholds`, `names`, `messages`; `cli` is the `gpusharing` command, `admin` its administrators'
subcommands.
"""
