package status

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

func num(p *int64) string {
	if p == nil {
		return "?"
	}
	return strconv.FormatInt(*p, 10)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteText writes the snapshot as an operator reads it: the sources that failed, one line per
// partition, then the summary. "?" is a value no reachable source had; "-" is none.
func WriteText(w io.Writer, s *Snapshot) error {
	for _, src := range s.Sources {
		if src.Err != "" {
			fmt.Fprintf(w, "could not read %s (%s); its columns show ?\n", src.Name, src.Addr)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	sharded := len(s.Shards) > 0
	shardCol := func(name string) string {
		if !sharded {
			return ""
		}
		return orDash(name) + "\t"
	}
	fmt.Fprintln(tw, shardCol("SHARD")+"TOPIC\tPARTITION\tOWNER\tTOKEN\tPOSITION\tCOMMITTED\tHIGH-WATERMARK\tLAG\tOUTBOX\tLAST RECOVERY")
	for _, p := range s.Partitions {
		rec := "-"
		if r := p.LastRecovery; r != nil {
			rec = fmt.Sprintf("%s->%s %s %s", r.From, r.To, r.Kind, r.At.Format(time.RFC3339))
		}
		owner := p.Owner.String()
		if p.Owner == nil && s.GroupState == "" {
			owner = "?"
		}
		token := orDash(p.Token)
		if p.Retired {
			token += " (retired)"
		}
		fmt.Fprintf(tw, "%s%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", shardCol(p.Shard), p.Topic, p.Partition, owner, token,
			num(p.Position), num(p.Committed), num(p.HighWatermark), num(p.Lag), num(p.Backlog), rec)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range s.Partitions {
		if p.Retired {
			fmt.Fprintf(w, "MOVING %s/%d: its fence on shard %s is retired (no member can claim or write it there); the next placement puts it elsewhere\n",
				p.Topic, p.Partition, p.Shard)
		}
		for _, e := range p.Elsewhere {
			if e.Retired {
				fmt.Fprintf(w, "moved %s/%d: retired on shard %s (token %s, position %d, %s); placed on shard %s\n",
					p.Topic, p.Partition, e.Shard, e.Token, e.Position, e.Claimant, orDash(p.Shard))
			} else {
				fmt.Fprintf(w, "NOT RETIRED %s/%d: a fence on shard %s (token %s, position %d, claimant %s) is not retired, and the placement puts the partition on shard %s: no member routes to it; it is not an owner\n",
					p.Topic, p.Partition, e.Shard, e.Token, e.Position, orDash(e.Claimant), orDash(p.Shard))
			}
		}
		if p.Lost != nil {
			fmt.Fprintf(w, "DATA LOSS %s/%d: offsets %d..%d were deleted from the log (it starts at %d) before they were applied\n",
				p.Topic, p.Partition, *p.Position+1, *p.LogStart-1, *p.LogStart)
		}
	}
	sm := s.Summary
	state := s.GroupState
	if state == "" {
		state = "unknown"
	}
	if sharded {
		v := "unknown"
		if s.Placement > 0 {
			v = fmt.Sprint(s.Placement)
		}
		fmt.Fprintf(w, "shards %s (home %s), placement version %s\n", strings.Join(s.Shards, ", "), s.Shards[0], v)
	}
	_, err := fmt.Fprintf(w, "group %s (%s): %d members, %d partitions owned, %d unowned, total lag %d, outbox backlog %d, %d recoveries (%d handovers, %d after a verified regression); refused stale writes are not stored (metric baton.consumer.stale_refusals); read in %s\n",
		s.Group, state, sm.Members, sm.Owned, sm.Unowned, sm.TotalLag, sm.Backlog, sm.Recoveries, sm.Handovers, sm.Regressions, s.Took.Round(time.Millisecond))
	return err
}

// WriteJSON writes the snapshot as one JSON object.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteRecoveries writes the recorded recoveries, oldest first.
func WriteRecoveries(w io.Writer, recs []Recovery) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	sharded := slices.ContainsFunc(recs, func(r Recovery) bool { return r.Shard != "" })
	shardCol := func(name string) string {
		if !sharded {
			return ""
		}
		return orDash(name) + "\t"
	}
	fmt.Fprintln(tw, "WHEN\t"+shardCol("SHARD")+"TOPIC\tPARTITION\tFROM\tTO\tKIND\tREASON")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s%s\t%d\t%s\t%s\t%s\t%s\n", r.At.Format(time.RFC3339), shardCol(r.Shard), r.Topic, r.Partition, r.From, r.To, r.Kind, r.Reason)
	}
	return tw.Flush()
}

// WriteTopics writes each topic's stored identity against the brokers' view.
func WriteTopics(w io.Writer, ts []TopicIdentity) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tSTATE\tSTORED ID\tSTORED PARTITIONS\tBROKER ID\tBROKER PARTITIONS\tLAST CHANGE")
	for _, t := range ts {
		sid, sp, bid, bp, last := "-", "-", "-", "-", "-"
		if t.Stored != nil {
			sid, sp = orDash(t.Stored.ID), strconv.Itoa(int(t.Stored.Partitions))
		}
		if t.Broker != nil {
			bid, bp = orDash(t.Broker.ID), strconv.Itoa(int(t.Broker.Partitions))
		}
		if n := len(t.Log); n > 0 {
			r := t.Log[n-1]
			last = r.At.Format(time.RFC3339) + " " + r.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Topic, t.State, sid, sp, bid, bp, last)
	}
	return tw.Flush()
}
