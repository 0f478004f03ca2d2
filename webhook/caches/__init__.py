"""What the webhook keeps in memory so that a review never waits on the network: namespaces' budget states polled from
the timekeeper (`budgets`), safe admission's local reservations (`reservations`), and resource claims and Jobs'
deadlines followed by watches (`claims`, `jobs`)."""
