"""The SQL side of accounting: pod ledgers, readings, idle streaks, usage, weights and fair share's decayed usage."""
