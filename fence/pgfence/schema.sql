-- pgfence schema. {{fences}}, {{recoveries}} and {{keyed}} are replaced by the validated,
-- quoted table names. Every statement is idempotent; Migrate runs them under an advisory
-- transaction lock so concurrent migrations do not race on the catalog.

-- One fence per (consumer group, topic, partition): the highest accepted token and the last
-- applied position (offset), and who holds the token. Tokens are (era, epoch) compared
-- lexicographically.
CREATE TABLE IF NOT EXISTS {{fences}} (
    group_id   text        NOT NULL,
    topic      text        NOT NULL,
    partition  integer     NOT NULL CHECK (partition >= 0),
    era        bigint      NOT NULL CHECK (era >= 0),
    epoch      bigint      NOT NULL CHECK (epoch >= 0),
    position   bigint      NOT NULL CHECK (position >= -1),
    claimant   text        NOT NULL DEFAULT '',
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);

-- Who holds the stored token (Claim, Recover): at most one claimant per token. Added to
-- tables created before it existed; '' means nobody.
ALTER TABLE {{fences}} ADD COLUMN IF NOT EXISTS claimant text NOT NULL DEFAULT '';

-- The audit trail of explicit era advances (Recover), oldest first by seq.
CREATE TABLE IF NOT EXISTS {{recoveries}} (
    group_id   text        NOT NULL,
    topic      text        NOT NULL,
    partition  integer     NOT NULL,
    seq        bigint      GENERATED ALWAYS AS IDENTITY,
    from_era   bigint      NOT NULL,
    from_epoch bigint      NOT NULL,
    to_era     bigint      NOT NULL,
    to_epoch   bigint      NOT NULL,
    reason     text        NOT NULL CHECK (reason <> ''),
    at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition, seq)
);

-- The identity of each source topic per group (fence.Topics), one row per recorded identity,
-- the latest (highest seq) current: the Kafka topic ID (KIP-516) whose offsets the fences hold
-- and the acknowledged partition count. Rows are only appended: adopted by the first claim that
-- saw the topic (fences from before this table adopt the incarnation present at the upgrade),
-- or set by an operator's reset (baton topics reset / ack).
CREATE TABLE IF NOT EXISTS {{topics}} (
    group_id   text        NOT NULL,
    topic      text        NOT NULL,
    seq        bigint      NOT NULL CHECK (seq >= 1),
    topic_id   text        NOT NULL,
    partitions integer     NOT NULL CHECK (partitions >= 1),
    reason     text        NOT NULL CHECK (reason <> ''),
    at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, seq)
);

-- Per-entity fences (the inbox): the highest (era, epoch, seq) admitted for (scope, id).
CREATE TABLE IF NOT EXISTS {{keyed}} (
    scope      text        NOT NULL,
    id         text        NOT NULL,
    era        bigint      NOT NULL CHECK (era >= 0),
    epoch      bigint      NOT NULL CHECK (epoch >= 0),
    seq        bigint      NOT NULL CHECK (seq >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, id)
);
