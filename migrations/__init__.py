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


for _file in sorted(resources.files(__name__).iterdir(), key=lambda f: f.name):
    if _file.name.endswith(".sql"):
        _register(_file.name.removesuffix(".sql"), _file.read_text(encoding="utf-8"))
