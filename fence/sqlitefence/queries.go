package sqlitefence

import "strings"

// queries holds the store's SQL with its table names spliced in once, at construction. Every
// value is a bound parameter; only the validated, quoted table names are spliced.
type queries struct {
	schema string

	// Fences: fencecheck.CheckClaim and CheckAdvance in SQL. A claim may move the fence only
	// within the stored era (eras advance only through Recover), to a higher epoch or to the
	// same epoch already held by this claimant (or by nobody: the zero token of a fence never
	// claimed). A write needs exactly the stored token and a batch starting after the stored
	// position. The insert of a missing row runs only for era 0 (a claim) or the zero token
	// (a write), the state of a fence never claimed.
	claimUpdate   string
	claimInsert   string
	advanceUpdate string
	advanceInsert string
	load          string
	addClaimant   string // upgrades a fence table created before the claimant column

	recoverFromZero string // CAS for an expected zero token: the row may not exist yet
	recoverUpdate   string // CAS for any other expected token
	recoveryInsert  string
	recoveries      string

	admit     string
	loadKeyed string

	topicLoad, topicInsert, topicHistory string // fence.Topics
	topicPartitions                      string // the partitions of a topic with a fence row
	topicReset                           string // upsert of one fence at a recreated topic's reset
}

func newQueries(n names) queries {
	schema := strings.NewReplacer(
		"{{fence}}", n.fence,
		"{{recovery_index}}", n.recoveryIndex,
		"{{recovery}}", n.recovery,
		"{{recovery_table}}", n.recoveryBare, // CREATE INDEX ... ON takes an unqualified table
		"{{keyed}}", n.keyed,
		"{{topics}}", n.topics,
	).Replace(schemaSQL)
	const key = ` WHERE grp = ?1 AND topic = ?2 AND partition = ?3`
	return queries{
		schema: schema,

		claimUpdate: `UPDATE ` + n.fence + ` SET epoch = ?5, claimant = ?6` + key +
			` AND era = ?4 AND (epoch < ?5 OR (epoch = ?5 AND` +
			` (claimant = ?6 OR (claimant = '' AND era = 0 AND epoch = 0)))) RETURNING position`,
		claimInsert: `INSERT INTO ` + n.fence + ` (grp, topic, partition, era, epoch, position, claimant)` +
			` VALUES (?1, ?2, ?3, 0, ?4, -1, ?5) ON CONFLICT DO NOTHING`,
		advanceUpdate: `UPDATE ` + n.fence + ` SET position = ?7` + key +
			` AND era = ?4 AND epoch = ?5 AND position < ?6`,
		advanceInsert: `INSERT INTO ` + n.fence + ` (grp, topic, partition, era, epoch, position)` +
			` VALUES (?1, ?2, ?3, 0, 0, ?4) ON CONFLICT DO NOTHING`,
		load:        `SELECT era, epoch, position, claimant FROM ` + n.fence + key,
		addClaimant: `ALTER TABLE ` + n.fence + ` ADD COLUMN claimant TEXT NOT NULL DEFAULT ''`,

		recoverFromZero: `INSERT INTO ` + n.fence + ` (grp, topic, partition, era, epoch, position, claimant)` +
			` VALUES (?1, ?2, ?3, 1, ?4, -1, ?5)` +
			` ON CONFLICT (grp, topic, partition) DO UPDATE SET era = 1, epoch = ?4, claimant = ?5 WHERE era = 0 AND epoch = 0`,
		recoverUpdate: `UPDATE ` + n.fence + ` SET era = ?4 + 1, epoch = ?6, claimant = ?7` + key +
			` AND era = ?4 AND epoch = ?5`,
		recoveryInsert: `INSERT INTO ` + n.recovery +
			` (grp, topic, partition, from_era, from_epoch, to_era, to_epoch, reason, at_unix_ns)` +
			` VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		recoveries: `SELECT from_era, from_epoch, to_era, to_epoch, reason, at_unix_ns FROM ` + n.recovery +
			key + ` ORDER BY seq`,

		// (era, epoch, seq) compared as a row value is exactly fencecheck.CheckAdmit: a higher token
		// with any sequence, or the same token with a higher sequence.
		admit: `INSERT INTO ` + n.keyed + ` (scope, id, era, epoch, seq) VALUES (?1, ?2, ?3, ?4, ?5)` +
			` ON CONFLICT (scope, id) DO UPDATE SET era = ?3, epoch = ?4, seq = ?5` +
			` WHERE (era, epoch, seq) < (?3, ?4, ?5)`,
		loadKeyed: `SELECT era, epoch, seq FROM ` + n.keyed + ` WHERE scope = ?1 AND id = ?2`,

		topicLoad: `SELECT seq, topic_id, partitions FROM ` + n.topics +
			` WHERE grp = ?1 AND topic = ?2 ORDER BY seq DESC LIMIT 1`,
		topicInsert: `INSERT INTO ` + n.topics + ` (grp, topic, seq, topic_id, partitions, reason, at_unix_ns)` +
			` VALUES (?, ?, ?, ?, ?, ?, ?)`,
		topicHistory: `SELECT seq, topic_id, partitions, reason, at_unix_ns FROM ` + n.topics +
			` WHERE grp = ?1 AND topic = ?2 ORDER BY seq`,
		topicPartitions: `SELECT partition, era, epoch FROM ` + n.fence + ` WHERE grp = ?1 AND topic = ?2`,
		// A sealed fence (epoch ?5, fencecheck.SealedEpoch) keeps its epoch and claimant.
		topicReset: `INSERT INTO ` + n.fence + ` (grp, topic, partition, era, epoch, position, claimant)` +
			` VALUES (?1, ?2, ?3, ?4, 0, -1, '')` +
			` ON CONFLICT (grp, topic, partition) DO UPDATE SET era = ?4, position = -1,` +
			` epoch = CASE WHEN epoch = ?5 THEN epoch ELSE 0 END, claimant = CASE WHEN epoch = ?5 THEN claimant ELSE '' END`,
	}
}
