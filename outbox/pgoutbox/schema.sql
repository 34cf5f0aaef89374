-- pgoutbox schema. {{outbox}} and {{cursors}} are replaced by the validated, quoted table
-- names. Every statement is idempotent; Migrate runs them under an advisory transaction lock.

-- One row per appended message. (group_id, topic, partition) is the source fence key; seq is
-- gap-free per source partition, allocated from the cursor row in the appending transaction.
-- era/epoch is the appending owner's token. created_at is clock_timestamp(), i.e. close to the
-- commit, for the commit->ack latency metric.
CREATE TABLE IF NOT EXISTS {{outbox}} (
    group_id        text        NOT NULL,
    topic           text        NOT NULL,
    partition       integer     NOT NULL CHECK (partition >= 0),
    seq             bigint      NOT NULL CHECK (seq >= 1),
    era             bigint      NOT NULL CHECK (era >= 0),
    epoch           bigint      NOT NULL CHECK (epoch >= 0),
    dest_topic      text        NOT NULL CHECK (dest_topic <> ''),
    msg_key         bytea,
    msg_value       bytea,
    headers         bytea,
    idempotency_key text        NOT NULL, -- '' when derived: group/topic/partition/seq
    traceparent     text        NOT NULL DEFAULT '',
    tracestate      text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (group_id, topic, partition, seq)
);

-- One row per source partition: the last sequence allocated and the last delivered (every row
-- at or below delivered_seq was acknowledged by the broker). Pending = last_seq - delivered_seq.
-- Kept apart from the rows so that deleting delivered rows never lets a sequence be reused.
CREATE TABLE IF NOT EXISTS {{cursors}} (
    group_id      text        NOT NULL,
    topic         text        NOT NULL,
    partition     integer     NOT NULL CHECK (partition >= 0),
    last_seq      bigint      NOT NULL CHECK (last_seq >= 0),
    delivered_seq bigint      NOT NULL DEFAULT 0 CHECK (delivered_seq >= 0 AND delivered_seq <= last_seq),
    delivered_at  timestamptz,
    PRIMARY KEY (group_id, topic, partition)
);

-- Rows the relay gave up on (outbox.Relay: a produce error that is permanent for the row, e.g.
-- the destination refuses its size, or the topic stayed missing): a full copy of the row, the
-- reason, and the token of the owner that dead-lettered it. The cursor's delivered_seq moved
-- past the row in the same statement, so the relay goes on with the next row, and the sequence
-- is never handed out again. Cleanup never deletes these: delete them yourself once handled
-- (re-append the message, or drop it).
CREATE TABLE IF NOT EXISTS {{deadletters}} (
    group_id        text        NOT NULL,
    topic           text        NOT NULL,
    partition       integer     NOT NULL CHECK (partition >= 0),
    seq             bigint      NOT NULL CHECK (seq >= 1),
    era             bigint      NOT NULL,
    epoch           bigint      NOT NULL,
    dest_topic      text        NOT NULL,
    msg_key         bytea,
    msg_value       bytea,
    headers         bytea,
    idempotency_key text        NOT NULL,
    traceparent     text        NOT NULL DEFAULT '',
    tracestate      text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL,
    reason          text        NOT NULL CHECK (reason <> ''),
    by_era          bigint      NOT NULL,
    by_epoch        bigint      NOT NULL,
    dead_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (group_id, topic, partition, seq)
);
