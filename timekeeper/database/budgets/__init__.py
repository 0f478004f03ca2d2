"""The SQL side of budgets: the store, its reads and safe admission's reservations."""
