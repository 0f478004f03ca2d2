"""Alembic migrations of the timekeeper's database; run them with `gpusharing db upgrade`."""
