-- What lives behind the agent WebSocket (issue 9): an agent's knowledge, the summaries
-- that compact long conversations, the standing relationship with each person, and what
-- every turn used. Times are milliseconds since the Unix epoch.

-- An agent's knowledge entries, searched with SQLite full-text search (bm25 ranks them).
CREATE TABLE agent_knowledge (
    entry_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    title TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX agent_knowledge_by_agent ON agent_knowledge (agent_id);
CREATE VIRTUAL TABLE agent_knowledge_fts USING fts5(
    title, text, content='agent_knowledge', content_rowid='rowid', tokenize='porter'
);

-- A conversation's summaries: each covers its messages up to after_position; the newest
-- one is where the next turn starts from.
CREATE TABLE agent_summaries (
    conversation_id TEXT NOT NULL REFERENCES agent_conversations (conversation_id),
    after_position INTEGER NOT NULL,
    summary TEXT NOT NULL,
    trigger TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, after_position)
) WITHOUT ROWID;

-- What an agent recorded about a person; the counts come from agent_conversations.
CREATE TABLE agent_relation_notes (
    agent_id TEXT NOT NULL,
    end_user_id TEXT NOT NULL REFERENCES agent_end_users (end_user_id),
    note TEXT NOT NULL,
    turn_id TEXT,
    recorded_at INTEGER NOT NULL
);
CREATE INDEX agent_relation_notes_by_person ON agent_relation_notes (agent_id, end_user_id, recorded_at);

-- One row per turn and kind: model (tokens), transcription (seconds), speech (seconds).
CREATE TABLE agent_usage (
    usage_id INTEGER PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    token_id TEXT NOT NULL,
    end_user_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    model TEXT,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    seconds REAL NOT NULL DEFAULT 0,
    credits REAL NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX agent_usage_by_token ON agent_usage (token_id)
