"""`make demo`: the whole system on loopback, on its embedded defaults."""
