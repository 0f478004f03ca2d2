"""The timekeeper: per-namespace GPU-minute budgets, exactly-once accounting of meter reports, demotion over budget."""
