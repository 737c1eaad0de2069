-- The journal: every record the runner says, in envelope order.
-- AUTOINCREMENT keeps sqlite_sequence at the highest envelope ever used, so
-- envelopes are never reused after pruning.
CREATE TABLE records (
    envelope INTEGER PRIMARY KEY AUTOINCREMENT,
    producer TEXT NOT NULL,
    seq INTEGER NOT NULL,
    class TEXT NOT NULL,
    at INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE UNIQUE INDEX records_producer_seq ON records (producer, seq);

-- One row per producer ever seen: its seq counter outlives pruning, and
-- closed says whether its terminal record was written.
CREATE TABLE producers (
    producer TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL,
    closed INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX producers_open ON producers (closed) WHERE closed = 0;
