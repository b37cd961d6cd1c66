"""Alembic revisions of the studio schema, run by `storage.migrations.ensure_schema` (no alembic.ini needed)."""
