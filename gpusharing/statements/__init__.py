"""Monthly billing statements signed and checked as transparency logs sign theirs: Merkle roots and signed notes."""
