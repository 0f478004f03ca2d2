"""Signed statements at the size of a large cluster's month (issue 41): closing a billing period of 10,000 namespaces,
about a million rows, verifying it from the database, exporting an auditor's copy and verifying that, each beside the
floor measured in the same run (the same rows read by a plain SELECT, the same number of leaves hashed by hashlib).

    python bench/statements.py               # 500 nodes, 3 pods a node at any time, 10,000 namespaces: November
    python bench/statements.py --postgres    # the same on a PostgreSQL server of its own
    python bench/statements.py --quick       # 20 nodes, 400 namespaces: a look in a minute or two

The month is bench/chargeback.py's (its Bench.build, imported): in a fresh database migrated to head (a SQLite file, or
PostgreSQL on loopback with its durable defaults, as testbed/postgres.py starts it), November 2026 of `--nodes` GPU
nodes counted every hour by the capacity ledger, `--pods-per-node` pods on each at any time, each living about a day in
one of `--namespaces` namespaces, billed by the ledger's own arithmetic and statements (the first hour through
ReportLedger.observe, the rest in bulk), and a price sheet recorded before the month, so that every charge is signed
with its price. At the defaults that is about 1.1 million pod_hours rows and 360,000 node-hours. The pods running when
the month opens have a few hours booked in October: October is stated first, not timed, so that the close measured is
November's alone.

What it measures, each step in a process of its own (a fresh interpreter, as the controller's task or the command
would run it), in this order:

  close                 StatementTask(StatementLog(db), BillingCalendar(MONTHLY), origin, SigningKeys(key)).run(now),
                        now a day after November's end: the rows read as leaves, hashed, the root signed, appended
  verify (database)     verify(StatementLog(db).stored(), [verifier]): every statement's rows read and hashed again
  export                `gpusharing statements export --database URL DIR` (gpusharing.cli.main, in process)
  verify (copy)         verify(read_statements(DIR), [verifier]): the copy, no database
  SELECT (yardstick)    the statement's two queries (the same join, order and collation), streamed through the same
                        kind of connection (Database.read(), yield_per as leaves() fetches), each row touched: no
                        encoding, no price, no hashing
  hashlib leaves        SHA-256 of as many leaves as the close's rows, of the copy's mean length, each 0x00 || leaf,
                        with hashlib alone
  hashlib tree          the same, and the RFC 6962 tree's inner nodes over them (n - 1 hashes more)

Each with its wall-clock time, its CPU time in the process (a PostgreSQL server's is not in it), and memory two ways:
`peak +` is the growth of the process's peak resident set over its resident set before the step (VmHWM after resetting
it through /proc/self/clear_refs, so that what SQLite and the drivers allocate counts as well as Python's objects;
without clear_refs, the growth of ru_maxrss), `max RSS` that peak itself, the interpreter and its imports included
(VmHWM again: not ru_maxrss, which Linux carries over from the parent, which holds the build). Then the statements
table's size and a statement's row (its note and its 32 bytes of leaf hash a row), and the copy's size on disk.
`--profile close|verify` runs that step once more, under cProfile (the close after deleting November's statement, which
it writes again byte for byte: Ed25519 signatures are deterministic), and prints where its time went.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import gc
import hashlib
import json
import pstats
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, select, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chargeback import HOUR, START, Bench, Figure, ReadFailed, _peak_rss_kib, timed  # noqa: E402  (bench/, this script's directory)

from gpusharing.cli import main as gpusharing_main  # noqa: E402
from gpusharing.contract import Period  # noqa: E402
from gpusharing.statements.directory import read_statements  # noqa: E402
from gpusharing.statements.merkle import HASH_SIZE  # noqa: E402
from gpusharing.statements.note import Signer, generate_signer  # noqa: E402
from gpusharing.statements.statement import origin_of  # noqa: E402
from gpusharing.statements.verify import Verification, verify  # noqa: E402
from testbed.postgres import bench_database  # noqa: E402
from timekeeper.chargeback.calendar import BillingCalendar  # noqa: E402
from timekeeper.chargeback.statements import SigningKeys  # noqa: E402
from timekeeper.cluster.statements import StatementTask  # noqa: E402
from timekeeper.database.chargeback.statements import STREAMED_ROWS, StatementLog  # noqa: E402
from timekeeper.database.connection import Database  # noqa: E402
from timekeeper.database.tables import statements  # noqa: E402

END = START + dt.timedelta(days=30)  # November
CLOSE_AT = END + dt.timedelta(days=1)  # November closed and settled, its capacity counted
OCTOBER_CLOSED = START + 2 * HOUR  # October (the hours of the pods running at the start) due, November not
CLUSTER = "bench"
STEPS = ("close", "verify (database)", "export", "verify (copy)")
YARDSTICKS = ("SELECT (yardstick)", "hashlib leaves", "hashlib tree")
PROFILED = {"close": "close", "verify": "verify (database)"}


def month_args(args: argparse.Namespace) -> argparse.Namespace:
    """bench/chargeback.py's options for the month it builds."""
    return argparse.Namespace(nodes=args.nodes, namespaces=args.namespaces, days=30, pods_per_node=args.pods_per_node,
                              postgres=args.postgres, sample_hours=1, billing_minutes=60, seed=args.seed)


def build(url: str, args: argparse.Namespace, work: Path, signer: Signer) -> None:
    """November in the database (bench/chargeback.py's month), and October stated."""
    tokens = work / "tokens"
    tokens.write_text("bench-admin-token admin bench\n")
    month = Bench(url, month_args(args), tokens)
    try:
        month.build()
        stated = task(month.db, signer).run(OCTOBER_CLOSED)
        with month.db.read() as conn:
            rows = conn.execute(select(func.sum(statements.c.tree_size))).scalar() or 0
        print(f"stated first, not timed: {stated.periods} period (October: the hours booked in it, {rows:,} rows)",
              flush=True)
    finally:
        month.close()


def task(db: Database, signer: Signer) -> StatementTask:
    return StatementTask(StatementLog(db), BillingCalendar(Period.MONTHLY), origin_of(CLUSTER), SigningKeys(signer))


# -- the steps, each in a process of its own ---------------------------------------------------------------------------


def run_step(name: str, args: argparse.Namespace, work: Path, rows: int = 0, leaf_bytes: int = 0,
             profile: bool = False) -> dict[str, Any]:
    command = [sys.executable, __file__, "--step", name, "--url", args.url, "--work", str(work), "--rows", str(rows),
               "--leaf-bytes", str(leaf_bytes), *(["--profiled"] if profile else [])]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise ReadFailed(said[-1][:300] if said else f"exit status {done.returncode}")
    *printed, last = done.stdout.splitlines()
    if printed:
        print("\n".join(printed))
    answer: dict[str, Any] = json.loads(last)
    return answer


def step_once(args: argparse.Namespace) -> int:
    """A step measured in this process (started by run_step), its figures printed as the last line."""
    work = Path(args.work)
    signer = Signer.from_text((work / "statement.key").read_text().strip())
    db = Database(args.url)
    try:
        step = Step(args.step, db, signer, work, args.rows, args.leaf_bytes)
        gc.collect()
        figure = Figure(args.step)
        if args.profiled:
            step.prepare_profile()
            profiler = cProfile.Profile()
            rows, size, note = profiler.runcall(step.run)
            print(f"\nwhere {args.step}'s time goes (cProfile, in a process of its own):")
            stats = pstats.Stats(profiler, stream=sys.stdout)
            stats.sort_stats("tottime").print_stats(25)
            stats.sort_stats("cumulative").print_stats(30)
            figure.walls, figure.cpus, figure.peaks = [0.0], [0.0], [0.0]
        else:
            with timed(figure):
                rows, size, note = step.run()
        max_rss = max_rss_kib() / 1024  # before what `after` reads
        rows, size, note = step.after(rows, size, note)
        print(json.dumps({"wall": figure.walls[0], "cpu": figure.cpus[0], "peak": figure.peaks[0],
                          "max_rss": max_rss, "rows": rows,
                          "size": size, "note": note}))
    finally:
        db.dispose()
    return 0


def max_rss_kib() -> int:
    """The process's peak resident set: VmHWM, which clear_refs set to the resident set before the step, so it is the
    peak over the step, the interpreter and its imports included. Not ru_maxrss: Linux carries the parent's peak into a
    child across fork and exec, and the parent holds the whole build."""
    try:
        return _peak_rss_kib()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


Measured = tuple[int | None, int | None, str]  # rows, bytes, a note


class Step:
    def __init__(self, name: str, db: Database, signer: Signer, work: Path, rows: int, leaf_bytes: int):
        self.name, self.db, self.signer, self.work = name, db, signer, work
        self.copy = work / "copy"
        self.rows, self.leaf_bytes = rows, leaf_bytes

    def run(self) -> Measured:
        if self.name == "close":
            done = task(self.db, self.signer).run(CLOSE_AT)
            assert done.periods == 1, done
            return None, None, ""
        if self.name == "verify (database)":
            return self.verified(verify(StatementLog(self.db).stored(), [self.signer.verifier]))
        if self.name == "export":
            status = gpusharing_main(["statements", "export", "--database", self.db.url, str(self.copy)])
            assert status == 0, status
            return None, None, ""
        if self.name == "verify (copy)":
            return self.verified(verify(read_statements(self.copy), [self.signer.verifier]))
        if self.name == "SELECT (yardstick)":
            return self.select(), None, ""
        if self.name == "hashlib leaves":
            return hash_leaves(self.rows, self.leaf_bytes, tree=False), None, f"{self.leaf_bytes} B a leaf"
        assert self.name == "hashlib tree", self.name
        return hash_leaves(self.rows, self.leaf_bytes, tree=True), None, f"{self.leaf_bytes} B a leaf"

    def after(self, rows: int | None, size: int | None, note: str) -> Measured:
        """What the step wrote, read after its timing: the statement's row, the copy's files."""
        if self.name == "close":
            with self.db.read() as conn:
                row = conn.execute(select(statements.c.tree_size, func.length(statements.c.note),
                                          func.length(statements.c.leaf_hashes))
                                   .order_by(statements.c.sequence.desc()).limit(1)).one()
            assert row.tree_size * HASH_SIZE == row[2], row
            return row.tree_size, row[1] + row[2], f"its row: a note of {row[1]} B and {row[2]:,} B of leaf hashes"
        if self.name == "export":
            files = [path for path in self.copy.iterdir() if path.is_file()]
            lines = sum(lines_in(path) for path in files if path.suffix == ".rows")
            rows_bytes = sum(path.stat().st_size for path in files if path.suffix == ".rows")
            return lines, sum(path.stat().st_size for path in files), \
                f"{len(files)} files; {rows_bytes / max(lines, 1):.0f} B a row, newline included"
        return rows, size, note

    def verified(self, result: Verification) -> Measured:
        assert result.ok, [str(finding) for finding in result.findings[:5]]
        return result.rows, None, f"{result.statements} statements, ok"

    def select(self) -> int:
        """StatementLog.leaves' queries, their rows streamed and touched, nothing made of them."""
        charges, capacity = StatementLog(self.db).queries(START, END)
        count = 0
        with self.db.read() as conn:
            for query in (charges, capacity):
                for row in conn.execution_options(yield_per=STREAMED_ROWS).execute(query):
                    count += row[0] is not None
        return count

    def prepare_profile(self) -> None:
        """The close is profiled on November again: its statement removed first (it is written again as it was)."""
        if self.name == "close":
            with self.db.write() as conn:
                conn.execute(delete(statements).where(statements.c.period_start == START))


def lines_in(path: Path) -> int:
    count = 0
    with open(path, "rb") as lines:
        while chunk := lines.read(1 << 20):
            count += chunk.count(b"\n")
    return count


def hash_leaves(count: int, length: int, tree: bool) -> int:
    """SHA-256 of `count` leaves of `length` bytes (each distinct), as RFC 6962 hashes a leaf; with `tree`, the inner
    nodes too, folded as a binary counter carries."""
    sha256 = hashlib.sha256
    prefix = b"\x00" + b"x" * max(0, length - 8)
    subtrees: list[bytes] = []
    for index in range(count):
        node = sha256(prefix + index.to_bytes(8, "big")).digest()
        if tree:
            carry = index
            while carry & 1:
                node = sha256(b"\x01" + subtrees.pop() + node).digest()
                carry >>= 1
            subtrees.append(node)
    return count


# -- the figures -------------------------------------------------------------------------------------------------------


def report(figures: dict[str, dict[str, Any]], backend: str) -> None:
    floor = figures.get("SELECT (yardstick)", {}).get("wall") or float("nan")
    print(f"\n{backend}: {'':<20} {'wall s':>8} {'CPU s':>8} {'peak +MiB':>10} {'max RSS MiB':>12} {'rows':>11} "
          f"{'µs a row':>9} {'MiB':>8} {'x SELECT':>9}")
    for name in (*STEPS, *YARDSTICKS):
        figure = figures.get(name)
        if figure is None:
            continue
        if "failed" in figure:
            print(f"{'':<{len(backend) + 2}}{name:<20} failed: {figure['failed']}")
            continue
        wall, rows, size = figure["wall"], figure["rows"], figure["size"]
        per_row = f"{wall / rows * 1e6:9.1f}" if rows else f"{'-':>9}"
        print(f"{'':<{len(backend) + 2}}{name:<20} {wall:8.2f} {figure['cpu']:8.2f} {figure['peak']:10.1f} "
              f"{figure['max_rss']:12.1f} {'-' if rows is None else f'{rows:,}':>11} {per_row} "
              f"{'-' if size is None else f'{size / 2**20:,.1f}':>8} {wall / floor:8.2f}x"
              f"{'  ' + figure['note'] if figure['note'] else ''}")
    close, leaves, tree = (figures.get(name, {}) for name in ("close", "hashlib leaves", "hashlib tree"))
    if "wall" in close and "wall" in tree and close.get("rows"):
        own = close["wall"] - floor - tree["wall"]
        print(f"\nthe close over its floor (the SELECT and hashlib's tree): {own:.2f} s, "
              f"{own / close['rows'] * 1e6:.1f} µs a row (hashlib's leaves alone: {leaves.get('wall', 0):.2f} s)")
    print("(peak +: the growth of the peak resident set over the step; max RSS: the process's, its imports included;\n"
          " x SELECT: the step's wall-clock time over the plain SELECT of the same rows)")


def sizes(url: str) -> None:
    """The statements table on disk, indexes (and PostgreSQL's TOAST) included."""
    database = Database(url)
    with database.read() as conn:
        count = conn.execute(select(func.count()).select_from(statements)).scalar_one()
        if database.is_sqlite:
            size = conn.execute(text("SELECT sum(pgsize) FROM dbstat WHERE name IN (SELECT name FROM sqlite_schema "
                                     "WHERE tbl_name = 'statements')")).scalar_one()
            what = "dbstat: the table's and its indexes' pages"
        else:
            size = conn.execute(text("SELECT pg_total_relation_size('statements')")).scalar_one()
            what = "pg_total_relation_size, TOAST included"
    database.dispose()
    print(f"statements table: {count} rows, {size / 2**20:.1f} MiB ({what})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500, help="GPU nodes (default 500)")
    parser.add_argument("--namespaces", type=int, default=10_000, help="namespaces (default 10,000)")
    parser.add_argument("--pods-per-node", type=int, default=3,
                        help="pods on a node at any time (default 3: about a million pod-hours in the month)")
    parser.add_argument("--quick", action="store_true", help="20 nodes and 400 namespaces (about 45,000 rows)")
    parser.add_argument("--postgres", action="store_true", help="a PostgreSQL server on loopback instead of SQLite")
    parser.add_argument("--profile", choices=sorted(PROFILED),
                        help="run the close or the verify from the database once more under cProfile")
    parser.add_argument("--seed", type=int, default=41)
    for internal in ("--step", "--url", "--work", "--rows", "--leaf-bytes"):  # a step in a process of its own
        parser.add_argument(internal, help=argparse.SUPPRESS)
    parser.add_argument("--profiled", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        args.rows, args.leaf_bytes = int(args.rows), int(args.leaf_bytes)
        return step_once(args)
    if args.quick:
        args.nodes, args.namespaces = 20, 400
    backend = "PostgreSQL" if args.postgres else "SQLite"
    with tempfile.TemporaryDirectory(prefix="tk-statements-") as directory, \
            bench_database("postgresql" if args.postgres else "sqlite", Path(directory)) as url:
        work = Path(directory)
        signer = generate_signer("bench")
        (work / "statement.key").write_text(signer.text + "\n")
        args.url = url
        build(url, args, work, signer)
        figures: dict[str, dict[str, Any]] = {}
        rows, leaf_bytes = 0, 300  # until the close and the export say
        for name in (*STEPS, *YARDSTICKS):
            try:
                figures[name] = measured = run_step(name, args, work, rows, leaf_bytes)
            except ReadFailed as failed:  # said, and the other steps made all the same
                figures[name] = {"failed": str(failed)}
                print(f"  {name:<20} failed: {failed}", flush=True)
                continue
            if name == "close":  # the yardsticks hash as many leaves as November's
                rows = measured["rows"]
            if name == "export":  # of the copy's mean length, its newline left out
                copied = sum(path.stat().st_size for path in (work / "copy").glob("*.rows"))
                leaf_bytes = round(copied / max(measured["rows"], 1)) - 1
            print(f"  {name:<20} {measured['wall']:8.2f} s  CPU {measured['cpu']:8.2f} s  peak "
                  f"+{measured['peak']:7.1f} MiB  max RSS {measured['max_rss']:7.1f} MiB  rows {measured['rows']}",
                  flush=True)
        report(figures, backend)
        sizes(url)
        if args.profile:
            run_step(PROFILED[args.profile], args, work, profile=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
