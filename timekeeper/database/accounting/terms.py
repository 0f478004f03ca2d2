"""What every charge is made at, recorded once by each process before its first charge: the GPU models' billing
weights (their audit log) and the price sheet. Neither is ever applied to what was charged before it was recorded."""

from __future__ import annotations

import datetime as dt

from gpusharing.gpu.catalogue import GpuCatalogue
from timekeeper.chargeback.prices import PriceSheet
from timekeeper.database.accounting.weights import WeightLog
from timekeeper.database.chargeback.prices import PriceLog
from timekeeper.database.connection import Database


class BillingTerms:
    def __init__(self, db: Database, catalogue: GpuCatalogue, catalogue_source: str, prices: PriceSheet,
                 prices_source: str):
        self.catalogue, self.catalogue_source = catalogue, catalogue_source
        self.price_sheet, self.prices_source = prices, prices_source
        self.weights = WeightLog(db)
        self.prices = PriceLog(db)
        self._recorded = False

    def record_once(self, now: dt.datetime) -> None:
        """Records them before anything is charged at them; a failure fails the caller's batch, as the database's."""
        if not self._recorded:
            self.weights.record(self.catalogue, now, self.catalogue_source)
            self.prices.record(self.price_sheet, now, self.prices_source)
            self._recorded = True
