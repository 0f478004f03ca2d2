"""The rows of a chargeback export (timekeeper/chargeback/export.py): each namespace's time per model and hour, the
capacity nobody held kept as the cluster's line or shared in proportion to what each namespace held (exactly, in
integers), corrections of closed periods booked where they came, and a tenant's export its own rows alone."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from timekeeper.chargeback.calendar import MONTHLY
from timekeeper.chargeback.export import ExportTerms, HeldHour, export_rows
from timekeeper.chargeback.focus import FocusCharge
from timekeeper.chargeback.prices import GpuPrice

UTC = dt.timezone.utc
A100, T4 = "NVIDIA A100-SXM4-80GB", "Tesla T4"
H9, H10 = dt.datetime(2026, 12, 1, 9, tzinfo=UTC), dt.datetime(2026, 12, 1, 10, tzinfo=UTC)
NOVEMBER_LAST = dt.datetime(2026, 11, 30, 23, tzinfo=UTC)
GPU_HOUR = 3_600_000_000


def price(model: str, hour: dt.datetime) -> GpuPrice | None:
    return GpuPrice(model, hour.date(), Decimal("2.5"), Decimal("2")) if model == A100 else None


def tags(owner: str | None, period: dt.datetime) -> dict[str, str]:
    return {"gpusharing.io/cluster": "c", **({"ns": owner} if owner else {})}


def terms(share: bool = False, namespace: str | None = None) -> ExportTerms:
    return ExportTerms(MONTHLY, price, tags, share, namespace)


HELD = [
    HeldHour(H9, "team-a", A100, H9, GPU_HOUR // 4),
    HeldHour(H9, "team-b", A100, H9, GPU_HOUR // 2),
    HeldHour(H9, "team-b", T4, H9, 1_000_000),
    HeldHour(H10, "team-a", A100, H10, 7),
]
UNALLOCATED = {H9: {A100: 3 * GPU_HOUR // 4 + 1, T4: 5}, H10: {A100: 10}, dt.datetime(2026, 12, 1, 11, tzinfo=UTC): {
    T4: GPU_HOUR}}


def lines(rows: list[FocusCharge]) -> list[tuple[dt.datetime, str | None, str, str, int]]:
    return [(row.charge_period_start, row.namespace, row.model, row.category, row.micro_gpu_seconds) for row in rows]


def test_unallocated_time_is_the_clusters_own_line_by_default_hour_by_hour() -> None:
    rows = list(export_rows([], HELD, UNALLOCATED, terms()))
    assert lines(rows) == [
        (H9, None, A100, "unallocated", 3 * GPU_HOUR // 4 + 1),
        (H9, None, T4, "unallocated", 5),
        (H9, "team-a", A100, "allocated", GPU_HOUR // 4),
        (H9, "team-b", A100, "allocated", GPU_HOUR // 2),
        (H9, "team-b", T4, "allocated", 1_000_000),
        (H10, None, A100, "unallocated", 10),
        (H10, "team-a", A100, "allocated", 7),
        (H10 + dt.timedelta(hours=1), None, T4, "unallocated", GPU_HOUR),
    ]
    first = rows[2]
    assert (first.billing_period_start, first.billing_period_end) == (
        dt.datetime(2026, 12, 1, tzinfo=UTC), dt.datetime(2027, 1, 1, tzinfo=UTC))
    assert (first.list_per_gpu_hour, first.contracted_per_gpu_hour) == (Decimal("2.5"), Decimal("2"))
    assert first.tags == {"gpusharing.io/cluster": "c", "ns": "team-a"} and not first.correction
    assert rows[1].list_per_gpu_hour is None  # the sheet prices no T4


def test_shared_unallocated_time_goes_to_the_holders_of_that_model_in_proportion_exactly() -> None:
    rows = lines(list(export_rows([], HELD, UNALLOCATED, terms(share=True))))
    shared = [row for row in rows if row[3] == "shared-unallocated"]
    # 3/4 GPU-hour + 1 micro-GPU-second over team-a (1/4) and team-b (1/2): a third and two thirds, rounded exactly.
    assert shared == [
        (H9, "team-a", A100, "shared-unallocated", GPU_HOUR // 4),
        (H9, "team-b", A100, "shared-unallocated", GPU_HOUR // 2 + 1),
        (H9, "team-b", T4, "shared-unallocated", 5),
        (H10, "team-a", A100, "shared-unallocated", 10),
    ]
    # An hour nobody held a model in keeps its unallocated time as the cluster's line.
    assert (H10 + dt.timedelta(hours=1), None, T4, "unallocated", GPU_HOUR) in rows
    total = sum(row[4] for row in rows)
    assert total == sum(row.micro_gpu_seconds for row in HELD) + sum(
        micro for models in UNALLOCATED.values() for micro in models.values())


def test_a_tenants_export_holds_its_own_rows_and_its_part_of_shared_time_only() -> None:
    assert lines(list(export_rows([], HELD, UNALLOCATED, terms(share=True, namespace="team-a")))) == [
        (H9, "team-a", A100, "allocated", GPU_HOUR // 4),
        (H9, "team-a", A100, "shared-unallocated", GPU_HOUR // 4),
        (H10, "team-a", A100, "allocated", 7),
        (H10, "team-a", A100, "shared-unallocated", 10),
    ]
    assert all(row[1] == "team-b" for row in lines(list(export_rows([], HELD, {}, terms(namespace="team-b")))))


def test_a_correction_comes_first_booked_in_the_period_it_came_naming_the_period_it_corrects() -> None:
    late = HeldHour(NOVEMBER_LAST, "team-a", A100, H9, -2_000_000)
    (row, *rest) = export_rows([late], HELD, {}, terms())
    assert len(rest) == len(HELD)
    assert row.correction and row.micro_gpu_seconds == -2_000_000 and row.category == "allocated"
    assert row.charge_period_start == NOVEMBER_LAST
    assert row.billing_period_start == dt.datetime(2026, 12, 1, tzinfo=UTC)
    assert row.corrected_period_start == dt.datetime(2026, 11, 1, tzinfo=UTC)
    assert row.list_per_gpu_hour == Decimal("2.5")  # priced as its own hour was
