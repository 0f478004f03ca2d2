"""`gpusharing webhook serve`: the webhook under gunicorn with TLS."""

from __future__ import annotations

import argparse
import os

from gpusharing.serving.server import MAX_THREADS, MAX_WORKERS, ServerOptions, serve
from gpusharing.settings.arguments import whole_number
from gpusharing.settings.env import ConfigError, env_int, env_text

# Two arenas keep a worker's memory level under large bodies, at no cost in speed on the webhook's load
# (docs/development.md has both benchmarks' figures).
MALLOC_ARENAS = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    webhook = subparsers.add_parser("webhook", help="the admission webhook")
    commands = webhook.add_subparsers(dest="webhook_command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "serve",
        help="serve /mutate and /validate over TLS",
        description="Serve the admission webhook over TLS. Settings come from GPUSHARING_* variables "
        "(docs/reference/settings.md).",
        epilog="example, on loopback with a certificate of its own:\n"
        "  gpusharing certs --format pem --output tls --name localhost --name 127.0.0.1\n"
        "  gpusharing webhook serve --host 127.0.0.1 --cert tls/tls.crt --key tls/tls.key",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--host", default=env_text("GPUSHARING_WEBHOOK_HOST", "0.0.0.0"))
    run.add_argument("--port", type=whole_number(1, 65535), default=env_int("GPUSHARING_WEBHOOK_PORT", 8443, 1))
    run.add_argument("--cert", default=os.environ.get("GPUSHARING_TLS_CERT"), help="PEM certificate (chain)")
    run.add_argument("--key", default=os.environ.get("GPUSHARING_TLS_KEY"), help="PEM private key")
    run.add_argument(
        "--workers", type=whole_number(1, MAX_WORKERS), default=env_int("GPUSHARING_WEBHOOK_WORKERS", 2, 1)
    )
    run.add_argument(
        "--threads", type=whole_number(1, MAX_THREADS), default=env_int("GPUSHARING_WEBHOOK_THREADS", 8, 1)
    )
    run.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> int:
    if not args.cert or not args.key:
        raise ConfigError(
            "the webhook serves TLS only: give --cert and --key (or GPUSHARING_TLS_CERT, GPUSHARING_TLS_KEY)"
        )
    for path in (args.cert, args.key):
        if not os.path.isfile(path):
            raise ConfigError(f"cannot read {path}: no such file")
    from webhook.config import WebhookConfig

    config = WebhookConfig.from_env()  # fail at start, in one line, on a bad setting rather than in every worker
    if config.client_ca_file and not os.path.isfile(config.client_ca_file):
        raise ConfigError(f"GPUSHARING_CLIENT_CA_FILE={config.client_ca_file}: no such file")
    if config.kubeconfig:
        from gpusharing.kube.client import api_client

        api_client(config.kubeconfig, "GPUSHARING_KUBECONFIG")
    serve(
        "webhook.app:create_app",
        ServerOptions(
            host=args.host,
            port=args.port,
            workers=args.workers,
            threads=args.threads,
            certfile=args.cert,
            keyfile=args.key,
            client_ca_file=config.client_ca_file,
            malloc_arenas=MALLOC_ARENAS,
        ),
    )
    return 0
