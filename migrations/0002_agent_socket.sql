-- The agent WebSocket's own rows: the people who talk to agents, the short-lived
-- tokens minted for them, their conversations and every message of those.
-- Times are milliseconds since the Unix epoch.
CREATE TABLE agent_end_users (
    end_user_id TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;

-- A token is kept only as the SHA-256 of its text; token_id is the part of the
-- token that finds its row.
CREATE TABLE agent_tokens (
    token_id TEXT PRIMARY KEY,
    token_sha256 TEXT NOT NULL,
    end_user_id TEXT NOT NULL REFERENCES agent_end_users (end_user_id),
    scope TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    revoked_at INTEGER,
    credit_limit REAL,
    credit_spent REAL NOT NULL DEFAULT 0
) WITHOUT ROWID;

CREATE TABLE agent_conversations (
    conversation_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    end_user_id TEXT NOT NULL REFERENCES agent_end_users (end_user_id),
    created_at INTEGER NOT NULL,
    deleted_at INTEGER
) WITHOUT ROWID;

-- The conversation as the model reads it: tool_calls is a JSON array of
-- {id, name, arguments} on an assistant message that called tools.
CREATE TABLE agent_messages (
    conversation_id TEXT NOT NULL REFERENCES agent_conversations (conversation_id),
    position INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    tool_calls TEXT,
    tool_call_id TEXT,
    turn_id TEXT,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, position)
) WITHOUT ROWID;
