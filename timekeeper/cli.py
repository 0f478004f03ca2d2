"""`gpusharing timekeeper serve` and `gpusharing db upgrade` (the admin's commands are in admin.commands)."""

from __future__ import annotations

import argparse
import sys

from gpusharing.serving.server import MAX_THREADS, MAX_WORKERS, ServerOptions, serve
from gpusharing.settings.arguments import whole_number
from gpusharing.settings.env import ConfigError, load_code


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    timekeeper = subparsers.add_parser("timekeeper", help="the budget service")
    commands = timekeeper.add_subparsers(dest="timekeeper_command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "serve",
        help="serve the timekeeper API under gunicorn (settings: TIMEKEEPER_*)",
        description="Serve the timekeeper's API. Settings come from TIMEKEEPER_* variables (docs/reference/settings.md); the database "
        "must be migrated first (gpusharing db upgrade).",
        epilog="examples:\n"
        "  TIMEKEEPER_AUTH=none gpusharing timekeeper serve --host 127.0.0.1     # on a laptop, anyone is admin\n"
        "  TIMEKEEPER_AUTH=static TIMEKEEPER_STATIC_TOKENS_FILE=tokens gpusharing timekeeper serve",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--host", help="address to listen on (TIMEKEEPER_HOST, default 0.0.0.0)")
    run.add_argument("--port", type=whole_number(1, 65535), help="port (TIMEKEEPER_PORT, default 8080)")
    run.add_argument("--workers", type=whole_number(1, MAX_WORKERS), help="gunicorn worker processes (TIMEKEEPER_WORKERS, default 2)")
    run.add_argument("--threads", type=whole_number(1, MAX_THREADS), help="threads per worker (TIMEKEEPER_THREADS, default 32)")
    run.set_defaults(run=_serve)

    db = subparsers.add_parser("db", help="the timekeeper's database")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    upgrade = db_commands.add_parser(
        "upgrade",
        help="create or migrate the database (TIMEKEEPER_DATABASE_URL) to this version",
        epilog="examples:\n"
        "  gpusharing db upgrade                                    # sqlite:///timekeeper.sqlite in this directory\n"
        "  gpusharing db upgrade --database-url postgresql+psycopg://tk:PASSWORD@db:5432/tk",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    upgrade.add_argument("--database-url", help="default: TIMEKEEPER_DATABASE_URL")
    upgrade.add_argument("--revision", default="head", help="target revision (default: head)")
    upgrade.set_defaults(run=_upgrade)


def _serve(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from timekeeper.api.auth import load_static_tokens
    from timekeeper.config import TimekeeperConfig
    from timekeeper.database.connection import Database
    from timekeeper.database.schema import schema_problem
    from timekeeper.services import NO_AUTH_WARNING, kube_api

    config = TimekeeperConfig.from_env()
    overrides = {key: getattr(args, key) for key in ("host", "port", "workers", "threads") if getattr(args, key) is not None}
    config = replace(config, **overrides)
    # What every worker's create_app needs, checked once here and said in one line: a worker that fails to boot
    # prints a traceback, and gunicorn gives up with exit status 3.
    if config.static_tokens_file:
        load_static_tokens(config.static_tokens_file)
    kube_api(config)
    load_code("TIMEKEEPER_CLOCK", config.clock)
    database = Database.from_config(config)
    problem = schema_problem(database.engine)
    database.dispose()
    if problem:
        raise ConfigError(f"not serving: {problem}")
    if config.auth == "none":
        print(f"WARNING: {NO_AUTH_WARNING}", file=sys.stderr)
    serve(
        "timekeeper.app:create_app",
        ServerOptions(host=config.host, port=config.port, workers=config.workers, threads=config.threads),
    )
    return 0


def _upgrade(args: argparse.Namespace) -> int:
    from alembic.util import CommandError
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from timekeeper.config import TimekeeperConfig, database_url
    from timekeeper.database.schema import first_line, upgrade

    url = database_url(args.database_url, "--database-url") if args.database_url else TimekeeperConfig.from_env().database_url
    try:
        upgrade(url, args.revision)
    except CommandError as exc:
        raise ConfigError(f"cannot migrate to --revision {args.revision}: {exc}") from None
    except SQLAlchemyError as exc:
        shown = make_url(url).render_as_string(hide_password=True)
        raise ConfigError(f"cannot migrate the database {shown}: {first_line(exc)}") from None
    print(f"database migrated to {args.revision}")
    return 0
