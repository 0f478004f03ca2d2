"""The admission webhook: validates GPU requests in every dialect and injects what governance needs.

`api` (the blueprints) over `admission` (the decision, plain functions) and `caches` (budget states, reservations,
claims and Jobs kept in memory); `app` wires them, `cli` serves them, `config` reads the settings.
"""
