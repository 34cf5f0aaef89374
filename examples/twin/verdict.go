package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// twinsAt reports whether every device's twin has folded n updates.
func twinsAt(db sqlDB, n int) func() bool {
	return func() bool {
		var k int
		err := db.QueryRow(context.Background(), `SELECT count(*) FROM twins WHERE version >= $1`, n).Scan(&k)
		return err == nil && k == devices
	}
}

// printTwins prints the twins table.
func printTwins(ctx context.Context, out *syncWriter, db sqlDB) error {
	rows, err := db.Query(ctx, `SELECT device, reported, desired, version FROM twins ORDER BY device`)
	if err != nil {
		return err
	}
	defer rows.Close()
	out.say("device  reported  desired  version")
	for rows.Next() {
		var d string
		var rep, des float64
		var v int64
		if err := rows.Scan(&d, &rep, &des, &v); err != nil {
			return err
		}
		out.say("%-7s %8.1f %8.1f %8d", d, rep, des, v)
	}
	return rows.Err()
}

// verdict checks the invariants and prints one line: every twin's version equals its number of
// updates, every command was appended once and applied once, and the zombie was refused.
func verdict(ctx context.Context, out *syncWriter, twins, gateway sqlDB, refused int) error {
	var wrongVersions, appended, applied, appliedTwice int
	err := errors.Join(
		twins.QueryRow(ctx, `SELECT count(*) FROM twins WHERE version != $1 OR last_seq != version`, perDevice).Scan(&wrongVersions),
		twins.QueryRow(ctx, `SELECT count(*) FROM baton_outbox`).Scan(&appended),
		gateway.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE times > 1) FROM applied`).Scan(&applied, &appliedTwice))
	if err != nil {
		return err
	}
	var bad []string
	if wrongVersions > 0 {
		bad = append(bad, fmt.Sprintf("%d twins with a wrong version", wrongVersions))
	}
	if appended != desiredTotal || applied != desiredTotal || appliedTwice > 0 {
		bad = append(bad, fmt.Sprintf("commands: %d appended, %d applied, %d applied twice; want %d, %d, 0",
			appended, applied, appliedTwice, desiredTotal, desiredTotal))
	}
	if refused < 1 {
		bad = append(bad, "no zombie write was refused: the fault did not bite")
	}
	if len(bad) > 0 {
		out.say("verdict: FAIL: %s", strings.Join(bad, "; "))
		return errors.New("invariants violated")
	}
	out.say("verdict: PASS: %d twins, each at version %d = its updates; %d commands, each applied once; zombie writes refused: %d",
		devices, perDevice, desiredTotal, refused)
	return nil
}
