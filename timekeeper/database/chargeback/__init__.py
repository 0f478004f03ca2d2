"""Chargeback's SQL: the price sheets recorded."""
