"""The clock of a `gpusharing timekeeper serve` process under test: TIMEKEEPER_CLOCK=tests.timekeeper.fake_clock:now.

Now is the instant written in the file CLOCK_FILE names, so a test moves the time of every worker at once.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

CLOCK = "tests.timekeeper.fake_clock:now"
CLOCK_FILE = "GPUSHARING_TEST_CLOCK_FILE"


def now() -> dt.datetime:
    return dt.datetime.fromisoformat(Path(os.environ[CLOCK_FILE]).read_text())


class FileClock:
    """The test's side: sets the time the served timekeeper reads."""

    def __init__(self, path: Path, start: dt.datetime):
        self.path = path
        self.set(start)

    def set(self, at: dt.datetime) -> None:
        self.now = at
        temporary = self.path.with_suffix(".new")
        temporary.write_text(at.isoformat())
        os.replace(temporary, self.path)  # a worker reads the old time or the new, never half a file

    def env(self) -> dict[str, str]:
        return {"TIMEKEEPER_CLOCK": CLOCK, CLOCK_FILE: str(self.path)}
