"""Fair share among namespaces in budget (issue #32): decayed usage, Fair Tree ranking, bands. Plain data."""
