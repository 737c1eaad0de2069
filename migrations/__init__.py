"""The schema of the runner's SQLite file, as numbered SQL files.

Each ``NNNN_name.sql`` beside this module is one migration, applied once, in
name order, in its own transaction, and recorded by sqlite-utils.
"""

from __future__ import annotations

from importlib import resources

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

MIGRATIONS = Migrations("curb-runner")


def _register(name: str, sql: str) -> None:
    def migrate(db: Database) -> None:
        for statement in sql.split(";\n"):
            if statement.strip():
                db.execute(statement)

    migrate.__name__ = name
    MIGRATIONS(name=name)(migrate)


_FILES = sorted(
    (f for f in resources.files(__name__).iterdir() if f.name.endswith(".sql")), key=lambda f: f.name
)
for _file in _FILES:
    _register(_file.name.removesuffix(".sql"), _file.read_text(encoding="utf-8"))

NAMES: tuple[str, ...] = tuple(f.name.removesuffix(".sql") for f in _FILES)
"""Every migration this runner knows; a journal that recorded another is from a newer runner."""
