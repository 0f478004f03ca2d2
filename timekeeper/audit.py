"""`gpusharing verify` and `gpusharing statements keygen|export` (docs/audit.md): the signed statements of closed
billing periods checked from the timekeeper's database or from an auditor's copy, copied out as plain files, and the
signing key made."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from gpusharing.contract import Period
from gpusharing.settings.env import ConfigError
from gpusharing.statements.directory import (
    KEYS_FILE,
    CopyError,
    read_keys,
    read_statements,
    write_keys,
    write_statement,
)
from gpusharing.statements.leaves import utc_text
from gpusharing.statements.note import NoteError, generate_signer, open_note
from gpusharing.statements.statement import Statement
from gpusharing.statements.verify import Finding, Verification, verify
from timekeeper.chargeback.calendar import BillingCalendar
from timekeeper.chargeback.statements import SETTLE
from timekeeper.config import chargeback_settings, database_url
from timekeeper.database.chargeback.statements import StatementLog
from timekeeper.database.connection import Database

EXIT_FINDINGS = 1
STATED_WITHIN = dt.timedelta(hours=1)  # a controller states a period within a minute or two of its settling


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    statements = subparsers.add_parser("statements", help="signed statements of closed billing periods")
    commands = statements.add_subparsers(dest="statements_command", required=True, metavar="COMMAND")
    keygen = commands.add_parser(
        "keygen", help="make a key to sign statements with (TIMEKEEPER_STATEMENT_KEY_FILE)",
        description="Write a new Ed25519 signing key (a C2SP signed-note key) to FILE, readable by its owner only, and "
        "print its verifier key: publish that one where auditors keep a copy.",
        epilog="example:\n  gpusharing statements keygen prod-gpus --out statement.key > statement.pub",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    keygen.add_argument("name", help="the key's name, as signatures show it (no spaces or '+')")
    keygen.add_argument("--out", required=True, type=Path, help="the signing key's file (refused if it exists)")
    keygen.set_defaults(run=_keygen)
    export = commands.add_parser(
        "export", help="copy statements, their rows and keys out as plain files for an auditor",
        description="Write the statements of the billing periods starting in [--from, --to) (all without them), the "
        "key handovers between them, each period's rows as they are now and the verifier keys into DIR, which "
        "`gpusharing verify --dir DIR` checks without a database (docs/audit.md). Reads TIMEKEEPER_DATABASE_URL.",
        epilog="example:\n  gpusharing statements export --from 2026-10-01 --to 2026-11-01 october/",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    export.add_argument("--from", dest="first", type=_day, help="the first day (UTC) a period may start on")
    export.add_argument("--to", dest="until", type=_day, help="the day (UTC) no exported period starts on or after")
    export.add_argument("--database", help="the database URL (default: TIMEKEEPER_DATABASE_URL)")
    export.add_argument("dir", type=Path, help="where to write (created; refused if it holds anything)")
    export.set_defaults(run=_export)

    check = subparsers.add_parser(
        "verify", help="check the signed statements and every row they sign",
        description="Check every statement's signature against the published keys, the chain of statements, and each "
        "closed period's rows against its signed tree, from the timekeeper's database (TIMEKEEPER_DATABASE_URL or "
        "--database) or from an auditor's copy (--dir). Each mismatch is named; the exit status is 1 if there is any.",
        epilog="examples:\n  gpusharing verify --keys published.pub\n  gpusharing verify --dir october/ --keys "
        "published.pub",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("--dir", type=Path, help="an auditor's copy (gpusharing statements export)")
    check.add_argument("--database", help="the database URL (default: TIMEKEEPER_DATABASE_URL)")
    check.add_argument("--against", type=Path, metavar="DIR",
                       help="with the database: an auditor's copy made before, whose every statement the database "
                       "must still hold byte for byte (statements removed and periods stated again show here)")
    check.add_argument("--keys", type=Path,
                       help="the published verifier keys, a line each (default with --dir: the copy's own keys file, "
                       "which proves only that the copy is consistent)")
    check.set_defaults(run=_verify)


def _keygen(args: argparse.Namespace) -> int:
    try:
        signer = generate_signer(args.name)
    except NoteError as exc:
        raise ConfigError(f"the key's name: {exc}") from None
    try:
        descriptor = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot write the signing key to {args.out}: {exc.strerror}") from None
    with os.fdopen(descriptor, "w") as out:
        out.write(signer.text + "\n")
    print(signer.verifier.text)
    return 0


def _export(args: argparse.Namespace) -> int:
    with _database_errors():
        return _export_from(args)


def _export_from(args: argparse.Namespace) -> int:
    log = _statement_log(args.database)
    directory: Path = args.dir
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ConfigError(f"{directory} exists and is not an empty directory: export into a new one")
    directory.mkdir(parents=True, exist_ok=True)
    statements = rows = 0
    for stored in log.stored(_midnight(args.first), _midnight(args.until)):
        rows += write_statement(directory, stored.number, stored.note, stored.leaf_hashes,
                                stored.rows() if stored.rows is not None else None)
        statements += 1
    write_keys(directory, log.signers())
    print(f"wrote {statements} statements and {rows:,} rows to {directory}; verify with: gpusharing verify --dir "
          f"{directory} --keys PUBLISHED-KEYS")
    return 0


def _verify(args: argparse.Namespace) -> int:
    try:
        if args.dir is not None:
            if args.database or args.against:
                raise ConfigError("--dir with --database or --against: verify the database or a copy")
            keys_path = args.keys or args.dir / KEYS_FILE
            if args.keys is None:
                print(f"(checking against the copy's own keys, {keys_path}: pass --keys with the published ones)",
                      file=sys.stderr)
            result = verify(read_statements(args.dir), read_keys(keys_path))
        else:
            return _verify_database(args)
    except CopyError as exc:
        raise ConfigError(str(exc)) from None
    return _said(result)


def _verify_database(args: argparse.Namespace) -> int:
    try:
        with _database_errors():
            if args.keys is None:
                raise ConfigError("--keys: the published verifier keys, a line each (gpusharing statements keygen "
                                  "printed the first)")
            log = _statement_log(args.database)
            result = verify(log.stored(), read_keys(args.keys))
            behind = _missing_at_the_end(log)
            if behind is not None:
                result.findings.append(behind)
            if args.against is not None:
                result.findings += _differ_from(log, args.against)
    except CopyError as exc:
        raise ConfigError(str(exc)) from None
    return _said(result)


@contextlib.contextmanager
def _database_errors() -> Iterator[None]:
    """The database's refusal as one line (no traceback): the URL's server down, a schema not migrated."""
    try:
        yield
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise ConfigError(f"cannot read the statements from the database: {reason} (is it migrated? gpusharing db "
                          "upgrade)") from None


def _differ_from(log: StatementLog, copy: Path) -> list[Finding]:
    """An earlier copy's statements the database no longer holds as they were."""
    findings = []
    for held in read_statements(copy):
        note = log.note(held.number)
        if note is None:
            findings.append(Finding(f"statement {held.number} of {copy}", "is not in the database: it was removed"))
        elif note != held.note:
            findings.append(Finding(f"statement {held.number} of {copy}", "differs from the database's statement "
                                    f"{held.number}: the database's was replaced (a fork of the chain)"))
    return findings


def _missing_at_the_end(log: StatementLog) -> Finding | None:
    """Statements removed from the chain's end leave no broken link: what is missing is told by the calendar of the
    last statement's kind of period and the grace the timekeeper runs with (TIMEKEEPER_BILLING_GRACE, read here as it
    reads it), an hour past the due."""
    head = log.head()
    last = log.note(head.sequence) if head is not None and head.period_end is not None else None
    if head is None or head.period_end is None or last is None:
        return None
    try:
        kind = Statement.parse(open_note(last, []).text).period
    except NoteError:
        return None  # verify has named it
    grace = chargeback_settings(os.environ).calendar.grace
    calendar = BillingCalendar(Period(kind.kind) if kind else Period.MONTHLY, grace)
    due = calendar.period_of(log.db.now() - calendar.grace - SETTLE - STATED_WITHIN).start
    if head.period_end >= due:
        return None
    return Finding("the statements", f"the last one states the time up to {utc_text(head.period_end)}, but every "
                   f"period up to {utc_text(due)} closed over an hour ago: statements after it were removed, or the "
                   "controller does not state them (its TIMEKEEPER_STATEMENT_KEY_FILE and the metric "
                   "gpusharing_controller_stated_until_seconds)")


def _said(result: Verification) -> int:
    for finding in result.findings:
        print(finding)
    if result.ok:
        first = result.first_sequence or 1
        print(f"verified statements {first} to {first + result.statements - 1} and their {result.rows:,} rows: every "
              "signature, the chain and every row match")
        return 0
    print(f"gpusharing verify: {len(result.findings)} findings in {result.statements} statements "
          f"({result.rows:,} rows read)", file=sys.stderr)
    return EXIT_FINDINGS


def _statement_log(database: str | None) -> StatementLog:
    raw = database or os.environ.get("TIMEKEEPER_DATABASE_URL", "").strip()
    if not raw:
        raise ConfigError("no database: set TIMEKEEPER_DATABASE_URL or pass --database (or verify a copy with --dir)")
    return StatementLog(Database(database_url(raw, "--database" if database else "TIMEKEEPER_DATABASE_URL")))


def _day(raw: str) -> dt.date:
    try:
        return dt.date.fromisoformat(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a day such as 2026-11-01") from None


def _midnight(day: dt.date | None) -> dt.datetime | None:
    return None if day is None else dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc)
