"""GPU utilisation per pod from DCGM's series in Prometheus (dcgm-exporter, as NVIDIA's GPU Operator installs it), plain
data: the PromQL query, Prometheus's answer read within bounds, and the governed pods' readings made of it. A device's
figure is a pod's only where the pod holds the device alone; on a shared one only the exporter's per-pod split counts,
and no data is unknown, never 0. docs/operations.md (DCGM through Prometheus) tells why, and what to configure.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpusharing.utilisation import PodUtilisation
from timekeeper.accounting.record import RecordedPod

# The utilisation metrics the query may read, and the factor that makes each a percentage: DCGM's profiling fields
# (DCGM_FI_PROF_*) are ratios, DCGM_FI_DEV_GPU_UTIL is a percentage.
DCGM_METRICS = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 100.0, "DCGM_FI_PROF_SM_ACTIVE": 100.0, "DCGM_FI_DEV_GPU_UTIL": 1.0}
DEFAULT_METRICS = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_GPU_UTIL")
# dcgm-exporter's own labels of a device: its UUID, its index and the node's name; a MIG instance's id.
UUID, GPU_INDEX, HOSTNAME, GPU_INSTANCE = "UUID", "gpu", "Hostname", "GPU_I_ID"
METRIC_LABEL = "gpusharing_metric"  # which metric a row of the answer came from (avg_over_time drops the name)
RECORD = "gpusharing:dcgm_pod_utilisation:percent"  # the query as a recording rule (tests, and who wants to record it)
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=|!=|=~|!~)\s*"(?:[^"\\\n]|\\.)*"\s*'
SELECTOR = re.compile(f"(?:{_MATCHER}(?:,{_MATCHER})*)?")  # PromQL label matchers: ns="a", job=~"b.*"

# Prometheus's answer is read within these bounds: beyond them it is refused whole, never read in part (a GPU's
# other pods cut off would make a shared GPU look like one pod's).
MAX_ANSWER_BYTES = 32 * 1024 * 1024
MAX_SERIES = 100_000
MAX_LABELS = 64
MAX_LABEL_CHARS = 1024
MAX_VALUE_CHARS = 64


@dataclass(frozen=True)
class DcgmQuery:
    """What to ask Prometheus (TIMEKEEPER_PROMETHEUS_* settings)."""

    # Which targets' series count: the exporter's own (its namespace, the target label the ServiceMonitor gives), so
    # that series a tenant's own exporter writes, naming other pods, are never read.
    selector: str = 'namespace="gpu-operator"'
    namespace_label: str = "exported_namespace"
    pod_label: str = "exported_pod"
    pod_uid_label: str = "pod_uid"  # "": the series carry no pod UID
    metrics: tuple[str, ...] = DEFAULT_METRICS  # by preference, on a GPU that one pod holds
    per_pod_metric: str = ""  # the metric the exporter splits per pod on a shared GPU; "": none
    window_seconds: int = 120

    @property
    def read_metrics(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.metrics, *filter(None, [self.per_pod_metric]))))

    @property
    def group_labels(self) -> tuple[str, ...]:
        labels = (HOSTNAME, UUID, GPU_INDEX, GPU_INSTANCE, self.namespace_label, self.pod_label, self.pod_uid_label)
        return tuple(dict.fromkeys(filter(None, (*labels, METRIC_LABEL))))


def utilisation_query(query: DcgmQuery) -> str:
    """One PromQL instant query: each metric's mean over the window, as a percentage, per device and pod, with the
    metric's name in METRIC_LABEL. Copies of a series (one per container or time-slicing replica) fold into one."""
    by = ", ".join(query.group_labels)
    matchers = ", ".join(filter(None, [query.selector.strip(), f'{query.pod_label}!=""']))
    parts = [
        f'max by ({by}) (label_replace({DCGM_METRICS[metric]:g} * avg_over_time({metric}{{{matchers}}}'
        f'[{query.window_seconds}s]), "{METRIC_LABEL}", "{metric}", "", ""))'
        for metric in query.read_metrics
    ]
    return "\n or ".join(parts)


class AnswerError(ValueError):
    """Prometheus's answer is not one this reads: the message says what is wrong with it."""


@dataclass(frozen=True)
class Series:
    """One row of the answer: a pod's figure on one device (or MIG instance) from one metric."""

    metric: str
    device: tuple[str, ...] | None  # None: the row names no device it can be told apart by
    namespace: str | None
    pod: str
    pod_uid: str | None
    percent: float | None  # None: NaN, infinite or negative; capped at 100


def read_answer(body: bytes, query: DcgmQuery) -> list[Series]:
    """The rows of `/api/v1/query`'s answer; AnswerError when it is too large, is an error, or is not a vector."""
    if len(body) > MAX_ANSWER_BYTES:
        raise AnswerError(f"the answer is larger than {MAX_ANSWER_BYTES // (1024 * 1024)} MiB")
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        raise AnswerError("the answer is not JSON") from None
    if not isinstance(answer, dict) or answer.get("status") != "success":
        said = answer.get("error") if isinstance(answer, dict) else None
        raise AnswerError(f"the query failed: {str(said)[:300]}" if said else "the answer is not a success")
    data = answer.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise AnswerError("the answer is not an instant vector")
    rows = data["result"]
    if len(rows) > MAX_SERIES:
        raise AnswerError(f"the answer has {len(rows)} series, more than {MAX_SERIES}")
    return [series for series in (_series(row, query) for row in rows) if series is not None]


def _series(row: object, query: DcgmQuery) -> Series | None:
    if not isinstance(row, dict) or not isinstance(row.get("metric"), dict) or not isinstance(row.get("value"), list):
        raise AnswerError("a series is not {metric, value}")
    labels: dict[str, Any] = row["metric"]
    if len(labels) > MAX_LABELS or not all(isinstance(v, str) and len(v) <= MAX_LABEL_CHARS for v in labels.values()):
        raise AnswerError(f"a series has more than {MAX_LABELS} labels, or a label that is not a short string")
    metric, pod = labels.get(METRIC_LABEL), labels.get(query.pod_label)
    if metric not in query.read_metrics or not pod:
        return None  # not a row of this query
    value = row["value"]
    if len(value) != 2 or not isinstance(value[1], str) or len(value[1]) > MAX_VALUE_CHARS:
        raise AnswerError("a series' value is not [time, \"number\"]")
    return Series(metric=metric, device=_device(labels), namespace=labels.get(query.namespace_label) or None, pod=pod,
                  pod_uid=(labels.get(query.pod_uid_label) or None) if query.pod_uid_label else None,
                  percent=_percent(value[1]))


def _device(labels: Mapping[str, str]) -> tuple[str, ...] | None:
    """A GPU by its UUID, else by its node and index; a MIG instance by its GPU and instance id."""
    instance = labels.get(GPU_INSTANCE, "")
    if labels.get(UUID):
        return (labels[UUID], instance)
    if labels.get(HOSTNAME) and labels.get(GPU_INDEX):
        return (labels[HOSTNAME], labels[GPU_INDEX], instance)
    return None


def _percent(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        raise AnswerError(f"a series' value {text[:20]!r} is not a number") from None
    if math.isnan(value) or math.isinf(value) or value < 0:
        return None
    return min(value, 100.0)


def pod_readings(series: Iterable[Series], pods: Mapping[tuple[str, str], RecordedPod], query: DcgmQuery,
                 now: dt.datetime) -> list[PodUtilisation]:
    """A reading for each running governed pod the series name: matched by UID where the series has it, else by
    namespace and name (a pod younger than the window then reads unknown: the name's series may be a predecessor's).
    Series of pods that are not governed, or no longer, are dropped. A pod's reading is its busiest device's; unknown
    where any of its devices is."""
    rows = list(series)
    holders: dict[tuple[str, ...], set[tuple[str | None, str]]] = defaultdict(set)
    for row in rows:
        if row.device is not None:
            holders[row.device].add((row.namespace, row.pod))
    by_uid = {pod.uid: pod for pod in pods.values()}
    young_after = now - dt.timedelta(seconds=query.window_seconds)
    mine: dict[str, dict[tuple[str, ...] | None, list[Series]]] = defaultdict(lambda: defaultdict(list))
    unsure: set[str] = set()
    for row in rows:
        pod = by_uid.get(row.pod_uid) if row.pod_uid else pods.get((row.namespace or "", row.pod))
        if pod is None or not pod.running or pod.finished_at is not None:
            continue
        if row.pod_uid is None and (pod.started_at is None or pod.started_at > young_after):
            unsure.add(pod.uid)
        mine[pod.uid][row.device].append(row)
    readings = []
    for uid, devices in mine.items():
        pod = by_uid[uid]
        values = [None if uid in unsure or device is None else
                  _device_percent(rows_on, len(holders[device]) > 1 or not _whole(pod), query)
                  for device, rows_on in devices.items()]
        known = [value for value in values if value is not None]
        readings.append(PodUtilisation(pod_uid=uid, namespace=pod.namespace, pod=pod.name,
                                       utilisation_percent=max(known) if len(known) == len(values) else None))
    return sorted(readings, key=lambda reading: (reading.namespace, reading.pod))


def _whole(pod: RecordedPod) -> bool:
    """Whether the webhook's record gives the pod whole GPUs: a fraction shares its device with others, whether or not
    the exporter shows them (without KUBERNETES_VIRTUAL_GPUS it labels a shared device with one of its pods)."""
    return pod.share is not None and pod.share >= 1


def _device_percent(rows: Sequence[Series], shared: bool, query: DcgmQuery) -> float | None:
    """The pod's figure on one device: on a shared one, the exporter's per-pod split alone; on its own, the first
    metric of the preference that has a figure."""
    if shared:
        split = [r.percent for r in rows if r.metric == query.per_pod_metric and r.pod_uid is not None]
        known = [percent for percent in split if percent is not None]
        return max(known) if known and len(known) == len(split) else None
    for metric in query.metrics:
        figures = [r.percent for r in rows if r.metric == metric and r.percent is not None]
        if figures:
            return max(figures)
    return None


def check_selector(matchers: str, setting: str) -> str:
    """PromQL label matchers, as the query writes them inside braces; ValueError naming the setting otherwise."""
    if not SELECTOR.fullmatch(matchers):
        raise ValueError(f'{setting}={matchers!r} must be PromQL label matchers, e.g. namespace="gpu-operator"')
    return matchers.strip()


def check_label(name: str, setting: str) -> str:
    """A Prometheus label name, as the query writes it unquoted; ValueError naming the setting otherwise."""
    if not LABEL_NAME.fullmatch(name):
        raise ValueError(f"{setting}={name!r} must be a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
    return name
