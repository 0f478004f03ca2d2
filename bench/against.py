"""One benchmark run twice, side by side: on this checkout and on another revision, in alternation, in one run.

    python bench/against.py main -- bench/timekeeper_ingest.py --backend both --seconds 10
    python bench/against.py c5d63a6 --rounds 3 -- bench/webhook_load.py

The other revision is checked out into a temporary git worktree and run with the same interpreter and packages, each
from its own tree (its code first on the path); the rounds alternate (baseline, this, baseline, ...) so that what
else the machine does falls on both alike. Each round's output is printed as it comes, labelled with its tree.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(tree: Path, label: str, command: list[str]) -> None:
    print(f"--- {label} ({tree})", flush=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, *command], cwd=tree, env=env, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("baseline", help="the revision to compare with (a branch, tag or commit)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each, alternating (default 2)")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    if not command:
        parser.error("give the benchmark after --, e.g. -- bench/timekeeper_ingest.py")
    with tempfile.TemporaryDirectory(prefix="gpusharing-baseline-") as scratch:
        baseline = Path(scratch) / "tree"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(baseline), args.baseline], check=True
        )
        try:
            for round_number in range(1, args.rounds + 1):
                run(baseline, f"baseline {args.baseline}, round {round_number}", command)
                run(REPO, f"this checkout, round {round_number}", command)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
