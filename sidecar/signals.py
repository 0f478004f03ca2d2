"""The meter's stop signals, blocked from the process's first instant and waited for between reports.

`gpusharing meter` blocks them before it loads anything else (`sidecar.cli.prepare`): a pod stopped while its meter
is still importing would otherwise kill the meter before its final report. Blocked, a signal waits until the meter's
first wait (`sidecar.meter.StopSignals`) takes it. This module imports nothing but `signal`.
"""

from __future__ import annotations

import signal

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def block_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
