"""What the tests and the benchmarks both run the system on, from the repository only (never in the wheel or the
image): a throwaway PostgreSQL server (postgres.py), the timekeeper and its controller as real processes
(timekeeper_processes.py), and the day-sum reads the budget rollups are held to and measured against (day_sums.py).
The stand-in Kubernetes API and the role processes they share with the demo are demo/'s."""
