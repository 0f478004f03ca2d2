"""What the webhook keeps in memory so that a review never waits on the network: namespaces' budget states polled from
the timekeeper (`budgets`), and resource claims, Jobs' deadlines and PriorityClasses followed by watches (`claims`,
`jobs`, `priorities`); and the one exception, safe admission's reservations, asked of the timekeeper within a short
timeout (`reservations`)."""
