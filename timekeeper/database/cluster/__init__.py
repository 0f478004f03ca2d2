"""The controller's own tables: eviction claims, published commitments and what each webhook holds in force."""
