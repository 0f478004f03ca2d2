"""`gpusharing webhook serve`: the webhook under gunicorn with TLS."""

from __future__ import annotations

import argparse
import os

from gpusharing.env import ConfigError, env_int, env_text
from gpusharing.serving import ServerOptions, serve


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    webhook = subparsers.add_parser("webhook", help="the admission webhook")
    commands = webhook.add_subparsers(dest="webhook_command", required=True, metavar="COMMAND")
    run = commands.add_parser("serve", help="serve /mutate and /validate over TLS")
    run.add_argument("--host", default=env_text("GPUSHARING_WEBHOOK_HOST", "0.0.0.0"))
    run.add_argument("--port", type=int, default=env_int("GPUSHARING_WEBHOOK_PORT", 8443, 1))
    run.add_argument("--cert", default=os.environ.get("GPUSHARING_TLS_CERT"), help="PEM certificate (chain)")
    run.add_argument("--key", default=os.environ.get("GPUSHARING_TLS_KEY"), help="PEM private key")
    run.add_argument("--workers", type=int, default=env_int("GPUSHARING_WEBHOOK_WORKERS", 2, 1))
    run.add_argument("--threads", type=int, default=env_int("GPUSHARING_WEBHOOK_THREADS", 8, 1))
    run.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> int:
    if not args.cert or not args.key:
        raise ConfigError("the webhook serves TLS only: give --cert and --key (or GPUSHARING_TLS_CERT, GPUSHARING_TLS_KEY)")
    for path in (args.cert, args.key):
        if not os.path.isfile(path):
            raise ConfigError(f"cannot read {path}: no such file")
    from webhook.config import WebhookConfig

    config = WebhookConfig.from_env()  # fail at start, in one line, on a bad setting rather than in every worker
    if config.kubeconfig:
        from gpusharing.kube import api_client

        api_client(config.kubeconfig, "GPUSHARING_KUBECONFIG")
    serve(
        "webhook.app:create_app",
        ServerOptions(host=args.host, port=args.port, workers=args.workers, threads=args.threads, certfile=args.cert, keyfile=args.key),
    )
    return 0
