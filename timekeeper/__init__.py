"""The timekeeper: GPU-minute budgets, exactly-once accounting of meter reports, demotion of what is over budget.

Its rooms, each importing only those below it: `api` (the HTTP blueprints) over `services` (built once per process)
over `cluster` (the Kubernetes side) and `accounting` over `budgets` over `database`; `app` wires them, `cli` runs
them, `config` reads the settings, `metrics` exposes them. docs/architecture.md walks a report through them.
"""
