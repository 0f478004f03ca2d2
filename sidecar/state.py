"""What the meter keeps on its emptyDir volume so that a restarted meter continues rather than starts over.

A container restart keeps the pod's emptyDir, so the start of the workload and the last sequence number
survive it: the cumulative total goes on from the first start (no reset, no double count) and sequence
numbers keep rising, which is what the timekeeper's exactly-once accounting relies on.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

log = logging.getLogger(__name__)

STATE_FILE = "meter-state.json"


@dataclass(frozen=True)
class MeterState:
    """What a restarted meter needs to go on: when the workload started and the last sequence number used."""

    pod_uid: str
    started_at: float  # Unix time of the meter's first start in this pod: billing runs from here
    seq: int = 0  # the last sequence number handed out; the next report uses a higher one

    def next_seq(self) -> "MeterState":
        return replace(self, seq=self.seq + 1)

    def to_json(self) -> dict[str, object]:
        return {"podUid": self.pod_uid, "startedAt": self.started_at, "seq": self.seq}


class StateFile:
    """The meter's state in a file of its emptyDir, written atomically."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / STATE_FILE

    def load(self, pod_uid: str) -> MeterState | None:
        """The saved state of this pod, or None when there is none (first start) or it cannot be used."""
        try:
            body = json.loads(self.path.read_text())
            state = MeterState(pod_uid=body["podUid"], started_at=float(body["startedAt"]), seq=int(body["seq"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Atomic writes make this unexpected; starting over under-bills rather than crashing the pod's meter.
            log.error("ignoring unreadable state file %s (%s): starting the count again", self.path, exc)
            return None
        if state.pod_uid != pod_uid:
            log.warning(
                "state file %s belongs to pod %s, not %s: starting the count again", self.path, state.pod_uid, pod_uid
            )
            return None
        return state

    def save(self, state: MeterState) -> None:
        """Replace the file atomically: a crash leaves either the old state or the new one, never half of either."""
        fd, temp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{STATE_FILE}.")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(state.to_json(), out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, self.path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # makes the rename itself durable
        finally:
            os.close(directory)
