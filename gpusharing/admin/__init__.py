"""The administrators' command line: `gpusharing budget|pods|explain|usage` and the kubectl plugin `kubectl gpusharing`.

A client of the timekeeper's HTTP API, never part of the server: `commands` (the subcommands and their options),
`client` (reaching the API, by URL or through the API server's service proxy), `cluster` (the kubeconfig's context),
`output` (JSON, YAML or a table, as -o asks), `tables` and `explain` (`gpusharing explain POD`).
"""
