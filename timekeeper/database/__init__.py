"""The database layer: the connection (PostgreSQL, or an embedded SQLite file with its writes serialized), the
tables (`tables`, which Alembic's migrations make), and the schema's version (`schema`)."""
