"""`gpusharing timekeeper serve` and `controller`, `gpusharing db upgrade` and `db downgrade` (the admin's commands are
in gpusharing.admin.commands)."""

from __future__ import annotations

import argparse
import sys

from gpusharing.serving.server import MAX_THREADS, MAX_WORKERS, ServerOptions, serve
from gpusharing.settings.arguments import whole_number
from gpusharing.settings.env import ConfigError, load_code


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    timekeeper = subparsers.add_parser("timekeeper", help="the budget service")
    commands = timekeeper.add_subparsers(dest="timekeeper_command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "serve",
        help="serve the timekeeper API under gunicorn (settings: TIMEKEEPER_*)",
        description="Serve the timekeeper's API. Settings come from TIMEKEEPER_* variables "
        "(docs/reference/settings.md); the database must be migrated first (gpusharing db upgrade).",
        epilog="examples:\n"
        "  TIMEKEEPER_AUTH=none gpusharing timekeeper serve --host 127.0.0.1     # on a laptop, anyone is admin\n"
        "  TIMEKEEPER_AUTH=static TIMEKEEPER_STATIC_TOKENS_FILE=tokens gpusharing timekeeper serve",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--host", help="address to listen on (TIMEKEEPER_HOST, default 0.0.0.0)")
    run.add_argument("--port", type=whole_number(1, 65535), help="port (TIMEKEEPER_PORT, default 8080)")
    run.add_argument(
        "--workers", type=whole_number(1, MAX_WORKERS), help="gunicorn worker processes (TIMEKEEPER_WORKERS, default 2)"
    )
    run.add_argument(
        "--threads", type=whole_number(1, MAX_THREADS), help="threads per worker (TIMEKEEPER_THREADS, default 32)"
    )
    run.set_defaults(run=_serve)
    controller = commands.add_parser(
        "controller",
        help="run the timekeeper's cluster work: billing, idle policies, GPUBudgets, evictions "
        "(settings: TIMEKEEPER_*)",
        description="Run the controller: the timekeeper's work on the cluster (bills from the API server's record, "
        "idle policies, GPUBudgets into the ledger and their status, Events, evictions), under a Lease so that one "
        "replica acts at a time. It reads the same TIMEKEEPER_* settings and database as `gpusharing timekeeper "
        "serve`, and serves /livez, /readyz and /metrics over plain HTTP on TIMEKEEPER_CONTROLLER_PORT (default 8081).",
        epilog="examples:\n"
        "  KUBECONFIG=~/.kube/config gpusharing timekeeper controller      # off-cluster, on the kubeconfig's cluster\n"
        "  gpusharing timekeeper controller --port 9090",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    controller.add_argument("--host", help="address of /livez, /readyz and /metrics (TIMEKEEPER_HOST, default 0.0.0.0)")
    controller.add_argument(
        "--port", type=whole_number(1, 65535), help="their port (TIMEKEEPER_CONTROLLER_PORT, default 8081)"
    )
    controller.set_defaults(run=_control)

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
    upgrade.set_defaults(run=_migrate, downgrade=False)
    downgrade = db_commands.add_parser(
        "downgrade",
        help="migrate the database (TIMEKEEPER_DATABASE_URL) back to an earlier revision, "
        "dropping what later ones added",
        description="Migrate the database back to REVISION: every later revision's columns and tables are dropped, "
        "with their data. Stop the timekeeper first: it refuses a database that is not at its own revision.",
        epilog="examples:\n"
        "  gpusharing db downgrade 0003_usage_reports           # or a unique prefix of it: 0003\n"
        "  gpusharing db downgrade base --database-url sqlite:///timekeeper.sqlite   # no table left",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    downgrade.add_argument(
        "revision", metavar="REVISION", help="a revision of migrations/versions (or a unique prefix), or base"
    )
    downgrade.add_argument("--database-url", help="default: TIMEKEEPER_DATABASE_URL")
    downgrade.set_defaults(run=_migrate, downgrade=True)


def _serve(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from timekeeper.auth import load_static_tokens
    from timekeeper.config import TimekeeperConfig
    from timekeeper.database.connection import Database
    from timekeeper.database.schema import schema_problem
    from timekeeper.services import NO_AUTH_WARNING, kube_api

    config = TimekeeperConfig.from_env()
    overrides = {
        key: getattr(args, key) for key in ("host", "port", "workers", "threads") if getattr(args, key) is not None
    }
    config = replace(config, **overrides)
    # What every worker's create_app needs, checked once here and said in one line: a worker that fails to boot
    # prints a traceback, and gunicorn gives up with exit status 3.
    if config.static_tokens_file:
        load_static_tokens(config.static_tokens_file)
    kube = kube_api(config)
    if kube is not None and config.auth == "tokenreview":
        kube.prepare_reviews()  # here, once, for every worker forked from this process
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


def _control(args: argparse.Namespace) -> int:
    """Runs the controller until SIGTERM or SIGINT, then gives its Lease up."""
    import logging
    import signal
    import threading

    from timekeeper.cluster.health import serve_health
    from timekeeper.config import TimekeeperConfig
    from timekeeper.controller import build_controller
    from timekeeper.database.schema import schema_problem

    config = TimekeeperConfig.from_env()
    manager = build_controller(config)
    problem = schema_problem(manager.budget_sync.budgets.db.engine)
    if problem:
        raise ConfigError(f"not running: {problem}")
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    server = serve_health(args.host or config.host, args.port or config.controller_port, lambda: manager.synced)
    manager.start()
    logging.getLogger("timekeeper.cluster.manager").info("controller running: /livez, /readyz and /metrics on port %d",
                                                          server.server_address[1])
    stopping.wait()
    manager.stop()
    server.shutdown()
    return 0


def _migrate(args: argparse.Namespace) -> int:
    """`db upgrade` or `db downgrade`: exit status 2 for a revision or URL that cannot be used, 1 when the database
    cannot be reached or refuses a migration."""
    from alembic.util import CommandError
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from timekeeper.config import TimekeeperConfig, database_url
    from timekeeper.database.schema import downgrade, first_line, missing_sqlite_file, upgrade

    url = (
        database_url(args.database_url, "--database-url")
        if args.database_url
        else TimekeeperConfig.from_env().database_url
    )
    shown = make_url(url).render_as_string(hide_password=True)
    if args.downgrade and (missing := missing_sqlite_file(url)):
        raise ConfigError(f"the database file {missing} does not exist: there is nothing to downgrade")
    try:
        (downgrade if args.downgrade else upgrade)(url, args.revision)
    except CommandError as exc:
        given = args.revision if args.downgrade else f"--revision {args.revision}"
        raise ConfigError(f"cannot migrate {shown} to {given}: {exc}") from None
    except SQLAlchemyError as exc:
        print(f"gpusharing: cannot migrate the database {shown}: {first_line(exc)}", file=sys.stderr)
        return 1
    print(f"database migrated {'down ' if args.downgrade else ''}to {args.revision}")
    return 0
