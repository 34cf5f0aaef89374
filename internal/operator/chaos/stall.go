package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// reportStall writes stall.txt into the log directory of a run whose application did not
// settle: the partitions not applied to their end, the outbox sources with rows not yet
// relayed and the fence each of them stores; then it stops every live worker with SIGQUIT,
// so that each worker's log ends with the stacks of all its goroutines (what each partition
// was waiting on). The run is over when it is called: the verdict follows.
func (h *harness) reportStall(ctx context.Context, topics []string) {
	if h.cfg.LogDir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var b strings.Builder
	fmt.Fprintf(&b, "the application did not settle within %s (at %s)\n\n", h.cfg.Settle, time.Now().UTC().Format(time.RFC3339Nano))

	b.WriteString("partitions not applied to their end (topic partition: last applied offset / end offset):\n")
	applied := map[incKey]int64{}
	if rows, err := h.db.Query(ctx, `SELECT topic, part, max(last_off) FROM chaos_applied GROUP BY topic, part`); err != nil {
		fmt.Fprintf(&b, "  reading chaos_applied: %v\n", err)
	} else {
		for rows.Next() {
			var k incKey
			var o int64
			if rows.Scan(&k.topic, &k.part, &o) == nil {
				applied[k] = o
			}
		}
		rows.Close()
	}
	if ends, err := h.adm.ListEndOffsets(ctx, topics...); err != nil {
		fmt.Fprintf(&b, "  listing end offsets: %v\n", err)
	} else {
		var lines []string
		ends.Each(func(o kadm.ListedOffset) {
			last, ok := applied[incKey{o.Topic, o.Partition}]
			if o.Err != nil {
				lines = append(lines, fmt.Sprintf("  %s %d: %v", o.Topic, o.Partition, o.Err))
			} else if o.Offset > 0 && (!ok || last < o.Offset-1) {
				lines = append(lines, fmt.Sprintf("  %s %d: %d / %d", o.Topic, o.Partition, last, o.Offset))
			}
		})
		slices.Sort(lines)
		if len(lines) == 0 {
			lines = []string{"  none"}
		}
		b.WriteString(strings.Join(lines, "\n") + "\n")
	}

	b.WriteString("\noutbox sources with rows not relayed (group topic partition: delivered / last seq; fence era.epoch):\n")
	if rows, err := h.db.Query(ctx, `SELECT c.group_id, c.topic, c.partition, c.delivered_seq, c.last_seq,
    COALESCE(f.era, -1), COALESCE(f.epoch, -1)
FROM baton_outbox_cursors c LEFT JOIN baton_fences f
  ON f.group_id = c.group_id AND f.topic = c.topic AND f.partition = c.partition
WHERE c.last_seq > c.delivered_seq ORDER BY 1, 2, 3`); err != nil {
		fmt.Fprintf(&b, "  reading the outbox cursors: %v\n", err)
	} else {
		n := 0
		for rows.Next() {
			var g, t string
			var p int32
			var delivered, last, era, epoch int64
			if rows.Scan(&g, &t, &p, &delivered, &last, &era, &epoch) == nil {
				fmt.Fprintf(&b, "  %s %s %d: %d / %d; fence %d.%d\n", g, t, p, delivered, last, era, epoch)
				n++
			}
		}
		rows.Close()
		if n == 0 {
			b.WriteString("  none\n")
		}
	}

	ps := h.alive()
	b.WriteString("\nlive workers, stopped with SIGQUIT (their logs end with every goroutine's stack):")
	for _, p := range ps {
		b.WriteString(" " + p.id)
	}
	b.WriteString("\n")
	_ = os.WriteFile(filepath.Join(h.cfg.LogDir, "stall.txt"), []byte(b.String()), 0o644)
	h.progress("the application did not settle: %s", filepath.Join(h.cfg.LogDir, "stall.txt"))
	for _, p := range ps {
		h.stop(p, syscall.SIGQUIT, 10*time.Second)
	}
}
