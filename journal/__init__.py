"""The runner's embedded journal: durable, ordered records that a stream can resume from."""

from ._journal import DEFAULT_RETENTION_RECORDS as DEFAULT_RETENTION_RECORDS
from ._journal import CursorAhead as CursorAhead
from ._journal import CursorTooOld as CursorTooOld
from ._journal import Journal as Journal
from ._journal import JournalClosed as JournalClosed
from ._journal import JournalFile as JournalFile
from ._journal import Record as Record
from ._journal import Window as Window
from ._journal import now_ms as now_ms
from ._journal import open_journal as open_journal
