"""The runner's embedded journal: durable, ordered records that a stream can resume from."""

from ._journal import DEFAULT_RETENTION_RECORDS as DEFAULT_RETENTION_RECORDS
from ._journal import CursorAhead as CursorAhead
from ._journal import CursorTooOld as CursorTooOld
from ._journal import Entry as Entry
from ._journal import Journal as Journal
from ._journal import JournalClosed as JournalClosed
from ._journal import JournalFile as JournalFile
from ._journal import JournalUnavailable as JournalUnavailable
from ._journal import JournalWriteFailed as JournalWriteFailed
from ._journal import Record as Record
from ._journal import Window as Window
from ._journal import now_ms as now_ms
from ._journal import open_journal as open_journal
from ._store import AgentStore as AgentStore
from ._store import ConversationRow as ConversationRow
from ._store import KnowledgeHit as KnowledgeHit
from ._store import RelationNote as RelationNote
from ._store import RelationRow as RelationRow
from ._store import Spent as Spent
from ._store import StoredMessage as StoredMessage
from ._store import StoredToolCall as StoredToolCall
from ._store import SummaryRow as SummaryRow
from ._store import TokenRow as TokenRow
from ._store import UsageRow as UsageRow
from ._store import open_agent_store as open_agent_store

__all__ = [
    "DEFAULT_RETENTION_RECORDS",
    "AgentStore",
    "ConversationRow",
    "CursorAhead",
    "CursorTooOld",
    "Entry",
    "Journal",
    "JournalClosed",
    "JournalFile",
    "JournalUnavailable",
    "JournalWriteFailed",
    "KnowledgeHit",
    "Record",
    "RelationNote",
    "RelationRow",
    "Spent",
    "StoredMessage",
    "StoredToolCall",
    "SummaryRow",
    "TokenRow",
    "UsageRow",
    "Window",
    "now_ms",
    "open_agent_store",
    "open_journal",
]
