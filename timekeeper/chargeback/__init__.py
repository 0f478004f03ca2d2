"""Chargeback, plain data: what GPU time costs (the price sheet), and what it is charged as."""
