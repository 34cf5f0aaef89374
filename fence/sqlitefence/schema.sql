-- Schema of a sqlitefence store. The {{...}} placeholders are replaced with the
-- quoted table names derived from the Table option. Every statement is idempotent: Migrate
-- runs the whole script in one write transaction (Open runs Migrate), and Schema returns it.
--
-- STRICT makes SQLite enforce the column types; the CHECK constraints keep hand-edited rows
-- from holding tokens or positions the fence rules could never produce.

-- One row per fence (group, topic, partition): the highest accepted token, the last
-- applied position (-1 for none) and who holds the token ('' for nobody). Migrate adds the
-- claimant column to tables created before it existed.
CREATE TABLE IF NOT EXISTS {{fence}} (
    grp       TEXT    NOT NULL,
    topic     TEXT    NOT NULL,
    partition INTEGER NOT NULL CHECK (partition >= 0),
    era       INTEGER NOT NULL CHECK (era >= 0),
    epoch     INTEGER NOT NULL CHECK (epoch >= 0),
    position  INTEGER NOT NULL CHECK (position >= -1),
    claimant  TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (grp, topic, partition)
) STRICT, WITHOUT ROWID;

-- The audit trail of Recover: every explicit era advance, oldest first by seq.
CREATE TABLE IF NOT EXISTS {{recovery}} (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    grp        TEXT    NOT NULL,
    topic      TEXT    NOT NULL,
    partition  INTEGER NOT NULL,
    from_era   INTEGER NOT NULL,
    from_epoch INTEGER NOT NULL,
    to_era     INTEGER NOT NULL,
    to_epoch   INTEGER NOT NULL,
    reason     TEXT    NOT NULL,
    at_unix_ns INTEGER NOT NULL
) STRICT;

CREATE INDEX IF NOT EXISTS {{recovery_index}} ON {{recovery_table}} (grp, topic, partition, seq);

-- The identity of each source topic per group (fence.Topics), one row per recorded identity,
-- the latest (highest seq) current: the topic ID (KIP-516) whose offsets the fences hold and
-- the acknowledged partition count. Rows are only ever appended: adopted by the first claim
-- that saw the topic, or set by an operator's reset.
CREATE TABLE IF NOT EXISTS {{topics}} (
    grp        TEXT    NOT NULL,
    topic      TEXT    NOT NULL,
    seq        INTEGER NOT NULL CHECK (seq >= 1),
    topic_id   TEXT    NOT NULL,
    partitions INTEGER NOT NULL CHECK (partitions >= 1),
    reason     TEXT    NOT NULL,
    at_unix_ns INTEGER NOT NULL,
    PRIMARY KEY (grp, topic, seq)
) STRICT, WITHOUT ROWID;

-- Keyed (per-entity) fences: for each (scope, id) the highest (token, seq) admitted.
CREATE TABLE IF NOT EXISTS {{keyed}} (
    scope TEXT    NOT NULL,
    id    TEXT    NOT NULL,
    era   INTEGER NOT NULL CHECK (era >= 0),
    epoch INTEGER NOT NULL CHECK (epoch >= 0),
    seq   INTEGER NOT NULL CHECK (seq >= 0),
    PRIMARY KEY (scope, id)
) STRICT, WITHOUT ROWID;
