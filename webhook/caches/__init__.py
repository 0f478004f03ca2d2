"""What the webhook keeps in memory so that a review never waits on the network: namespaces' budget states polled from
the timekeeper (`budgets`), and resource claims and Jobs' deadlines followed by watches (`claims`, `jobs`); and the
one exception, safe admission's reservations, asked of the timekeeper within a short timeout (`reservations`)."""
