"""The meter loop: a cumulative report every interval, retries that lose nothing, a final report on SIGTERM."""

from __future__ import annotations

import logging
import random
import signal
import time
from collections.abc import Callable

from gpusharing.contract import MeterEnv
from gpusharing.outage import Outage
from gpusharing.report import MeterReport
from gpusharing.serving.logs import add_context
from gpusharing.settings.env import ConfigError
from sidecar.client import Answer, Delivery, TimekeeperClient
from sidecar.config import MeterConfig
from sidecar.nvml import GpuReader, load_reader
from sidecar.signals import STOP_SIGNALS, block_stop_signals
from sidecar.state import MeterState, StateFile

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 5.0
# The final report gets this long after SIGTERM, so the meter is gone well inside the default 30 s grace period
# even when the timekeeper is unreachable (a report under way when SIGTERM came adds at most one request timeout).
FINAL_DEADLINE_SECONDS = 5.0
FINAL_RETRY_SECONDS = 0.5
MAX_BACKOFF_DOUBLINGS = 16


def retry_delay(failures: int, interval: float, uniform: Callable[[], float] = random.random) -> float:
    """Seconds to wait after `failures` (>= 1) failed attempts in a row.

    Doubles from a quarter of the interval up to four intervals; equal jitter (half fixed, half random)
    keeps the meters of many pods from returning to a recovered timekeeper all at once.
    """
    ceiling = min(4 * interval, interval / 4 * 2 ** min(failures - 1, MAX_BACKOFF_DOUBLINGS))
    return ceiling / 2 + uniform() * ceiling / 2


class Meter:
    """Reports its pod's cumulative GPU-seconds under rising sequence numbers, resuming from the state file after a
    restart."""

    def __init__(
        self,
        config: MeterConfig,
        client: TimekeeperClient,
        state_file: StateFile,
        gpu: GpuReader | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.client = client
        self.state_file = state_file
        self.gpu = gpu
        self.clock = clock
        self.state = self._resume()
        self._failures = 0
        self._outage = Outage(log, f"the timekeeper at {config.timekeeper_url}", "reports", clock)
        self._budget_state: str | None = None

    def _resume(self) -> MeterState:
        state = self.state_file.load(self.config.pod_uid)
        if state is not None:
            log.info("continuing the count begun at %s from report %d", _utc(state.started_at), state.seq)
            return state
        state = MeterState(pod_uid=self.config.pod_uid, started_at=self.clock())
        try:
            self.state_file.save(state)
        except OSError as exc:
            raise ConfigError(
                f"{MeterEnv.STATE_DIR}={str(self.config.state_dir)!r}: cannot write the state file: {exc}"
            ) from None
        return state

    def gpu_seconds(self) -> float:
        """Cumulative billed GPU-seconds: share x time since the first start (x the demo's time scale)."""
        elapsed = max(0.0, self.clock() - self.state.started_at)
        return round(self.config.gpu_share * elapsed * self.config.time_scale, 3)

    def build_report(self, seq: int, final: bool) -> MeterReport:
        reading = self.gpu.read() if self.gpu is not None else None
        return MeterReport(
            pod_uid=self.config.pod_uid,
            namespace=self.config.namespace,
            pod=self.config.pod_name,
            gpu_share=self.config.gpu_share,
            seq=seq,
            gpu_seconds=self.gpu_seconds(),
            final=final,
            gpu_memory_used_mib=reading.memory_used_mib if reading else None,
            gpu_utilization_percent=reading.utilization_percent if reading else None,
            gpu_memory_requested_mib=self.config.gpu_memory_requested_mib,
            gpu_model=reading.model if reading else None,
        )

    def report(self, final: bool, timeout: float) -> Answer:
        """Send one report under a sequence number saved before it leaves, so no number is ever used twice."""
        self.state = self.state.next_seq()
        try:
            self.state_file.save(self.state)
        except OSError as exc:
            log.error(
                "cannot save the meter state to %s (%s): a restart would repeat sequence numbers",
                self.state_file.path,
                exc,
            )
        report = self.build_report(self.state.seq, final)
        answer = self.client.send(report, timeout)
        self._note(report, answer)
        return answer

    def _note(self, report: MeterReport, answer: Answer) -> None:
        if answer.delivery is Delivery.UNAVAILABLE:
            self._failures += 1
            self._outage.failed(f"report {report.seq} not delivered: {answer.detail}", "the meter keeps counting and "
                                "tries again with backoff; the first report delivered carries the whole total")
            return
        # A refusal is an answer too: the outage is over.
        self._outage.succeeded(f"report {report.seq} accepted: {report.gpu_seconds:.3f} GPU-seconds"
                               if answer.delivery is Delivery.ACCEPTED else f"report {report.seq} answered")
        if answer.delivery is Delivery.REFUSED:
            self._failures = 0
            log.error("report %d refused by the timekeeper: %s", report.seq, answer.detail)
            return
        if report.seq == 1 or report.final:
            log.info(
                "report %d accepted: %.3f GPU-seconds%s",
                report.seq,
                report.gpu_seconds,
                " (final)" if report.final else "",
            )
        self._failures = 0
        if answer.budget_state and answer.budget_state != self._budget_state:
            log.info("namespace %s is %s", self.config.namespace, answer.budget_state)
            self._budget_state = answer.budget_state

    def run(self, stop_requested: Callable[[float], bool]) -> None:
        """Report until `stop_requested(seconds)` (which waits up to that long) says stop, then report once more."""
        while True:
            try:
                self.report(final=False, timeout=REQUEST_TIMEOUT_SECONDS)
            except Exception:  # a meter that exits on its own would restart and lose its place: log, keep going
                self._failures += 1
                log.exception("report failed unexpectedly")
            delay = (
                retry_delay(self._failures, self.config.interval_seconds)
                if self._failures
                else self.config.interval_seconds
            )
            if stop_requested(delay):
                break
        self.finish()

    def finish(self) -> None:
        """The final report, tried until FINAL_DEADLINE_SECONDS have passed, then give up: the pod is going."""
        deadline = time.monotonic() + FINAL_DEADLINE_SECONDS
        delivery = Delivery.UNAVAILABLE
        while True:
            try:
                delivery = self.report(final=True, timeout=max(0.1, deadline - time.monotonic())).delivery
            except Exception:  # exiting 0 matters more than this report: the pod is being stopped
                log.exception("final report failed unexpectedly")
                break
            if delivery is not Delivery.UNAVAILABLE or deadline - time.monotonic() <= FINAL_RETRY_SECONDS:
                break
            time.sleep(FINAL_RETRY_SECONDS)
        if delivery is not Delivery.ACCEPTED:
            log.error("stopping without a final report; the timekeeper keeps the last total it accepted")
        self.client.close()


class StopSignals:
    """SIGTERM and SIGINT, taken synchronously: blocked from the process's start, then waited for between reports.

    Waiting with sigtimedwait rather than handling them asynchronously means a signal never interrupts a
    state-file write or a request half-way; it is seen at the next wait, at most one request timeout later.
    """

    def __init__(self) -> None:
        block_stop_signals()  # already, when `gpusharing meter` runs it: see sidecar.signals

    def __call__(self, seconds: float) -> bool:
        received = signal.sigtimedwait(STOP_SIGNALS, max(0.0, seconds))
        if received is not None:
            log.info("%s received: sending the final report", signal.Signals(received.si_signo).name)
        return received is not None


def run_meter(config: MeterConfig) -> None:
    """`gpusharing meter`: reports until SIGTERM or SIGINT, then sends the final report."""
    stop = StopSignals()
    add_context(namespace=config.namespace, pod=config.pod_name, pod_uid=config.pod_uid)
    try:
        config.state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{MeterEnv.STATE_DIR}={str(config.state_dir)!r}: {exc.strerror or exc}") from None
    gpu = load_reader(config.gpu_reader, config.pod_uid)
    meter = Meter(config, TimekeeperClient(config.timekeeper_url, config.token_path), StateFile(config.state_dir), gpu)
    log.info(
        "metering pod %s/%s (uid %s, GPU share %g) to %s every %gs%s",
        config.namespace,
        config.pod_name,
        config.pod_uid,
        config.gpu_share,
        config.timekeeper_url,
        config.interval_seconds,
        f", time scaled x{config.time_scale:g} (demo only)" if config.time_scale != 1 else "",
    )
    meter.run(stop)


def _utc(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))
