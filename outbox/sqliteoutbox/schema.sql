-- sqliteoutbox schema; {{outbox}} and {{cursors}} are the validated, quoted table names. Every
-- statement is idempotent: Migrate runs the script in one transaction; Schema returns it. See pgoutbox/schema.sql for the meaning
-- of the columns; created_ns is the appending process's clock in Unix nanoseconds.
CREATE TABLE IF NOT EXISTS {{outbox}} (
    grp             TEXT    NOT NULL,
    topic           TEXT    NOT NULL,
    partition       INTEGER NOT NULL CHECK (partition >= 0),
    seq             INTEGER NOT NULL CHECK (seq >= 1),
    era             INTEGER NOT NULL CHECK (era >= 0),
    epoch           INTEGER NOT NULL CHECK (epoch >= 0),
    dest_topic      TEXT    NOT NULL CHECK (dest_topic <> ''),
    msg_key         BLOB,
    msg_value       BLOB,
    headers         BLOB,
    idempotency_key TEXT    NOT NULL,
    traceparent     TEXT    NOT NULL,
    tracestate      TEXT    NOT NULL,
    created_ns      INTEGER NOT NULL,
    PRIMARY KEY (grp, topic, partition, seq)
) STRICT, WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS {{cursors}} (
    grp           TEXT    NOT NULL,
    topic         TEXT    NOT NULL,
    partition     INTEGER NOT NULL CHECK (partition >= 0),
    last_seq      INTEGER NOT NULL CHECK (last_seq >= 0),
    delivered_seq INTEGER NOT NULL DEFAULT 0 CHECK (delivered_seq >= 0 AND delivered_seq <= last_seq),
    PRIMARY KEY (grp, topic, partition)
) STRICT, WITHOUT ROWID;

-- Rows the relay dead-lettered: a copy of the row, the reason, the dead-lettering owner's token
-- and the time (Unix ns). See pgoutbox/schema.sql. Cleanup never deletes these.
CREATE TABLE IF NOT EXISTS {{deadletters}} (
    grp             TEXT    NOT NULL,
    topic           TEXT    NOT NULL,
    partition       INTEGER NOT NULL CHECK (partition >= 0),
    seq             INTEGER NOT NULL CHECK (seq >= 1),
    era             INTEGER NOT NULL,
    epoch           INTEGER NOT NULL,
    dest_topic      TEXT    NOT NULL,
    msg_key         BLOB,
    msg_value       BLOB,
    headers         BLOB,
    idempotency_key TEXT    NOT NULL,
    traceparent     TEXT    NOT NULL,
    tracestate      TEXT    NOT NULL,
    created_ns      INTEGER NOT NULL,
    reason          TEXT    NOT NULL CHECK (reason <> ''),
    by_era          INTEGER NOT NULL,
    by_epoch        INTEGER NOT NULL,
    dead_ns         INTEGER NOT NULL,
    PRIMARY KEY (grp, topic, partition, seq)
) STRICT, WITHOUT ROWID;
