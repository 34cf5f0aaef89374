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
// relayed and the fence each of them stores; then it stops every live worker with SIGQUIT, all
// at once (a worker's exit frees the connections and locks the others may wait on), so that
// each worker's log ends with the stacks of all its goroutines (what each partition was
// waiting on). The run is over when it is called: the verdict follows.
func (h *harness) reportStall(ctx context.Context, topics []string) {
	if h.cfg.LogDir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var b strings.Builder
	fmt.Fprintf(&b, "the application did not settle within %s (at %s)\n\n", h.cfg.Settle, time.Now().UTC().Format(time.RFC3339Nano))

	b.WriteString("partitions not applied to their end, in the topic's current incarnation (topic partition: last applied offset / end offset):\n")
	if applied, err := h.appliedEnds(ctx); err != nil {
		fmt.Fprintf(&b, "  reading chaos_applied: %v\n", err)
	} else if ends, err := h.adm.ListEndOffsets(ctx, topics...); err != nil {
		fmt.Fprintf(&b, "  listing end offsets: %v\n", err)
	} else {
		var lines []string
		ends.Each(func(o kadm.ListedOffset) {
			last, ok := applied[incKey{o.Topic, o.Partition}]
			switch {
			case o.Err != nil:
				lines = append(lines, fmt.Sprintf("  %s %d: %v", o.Topic, o.Partition, o.Err))
			case o.Offset > 0 && !ok:
				lines = append(lines, fmt.Sprintf("  %s %d: none / %d", o.Topic, o.Partition, o.Offset))
			case o.Offset > 0 && last < o.Offset-1:
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
	if lines, err := unrelayed(ctx, h.db); err != nil {
		fmt.Fprintf(&b, "  %v\n", err)
	} else if len(lines) == 0 {
		b.WriteString("  none\n")
	} else {
		b.WriteString(strings.Join(lines, "\n") + "\n")
	}

	ps := h.alive()
	b.WriteString("\nlive workers, stopped with SIGQUIT (their logs end with every goroutine's stack):")
	for _, p := range ps {
		b.WriteString(" " + p.id)
	}
	b.WriteString("\n")
	path := filepath.Join(h.cfg.LogDir, "stall.txt")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		h.progress("the application did not settle; writing %s: %v", path, err)
	} else {
		h.progress("the application did not settle: %s", path)
	}
	for _, p := range ps {
		_ = p.cmd.Process.Signal(syscall.SIGCONT) // a frozen process cannot run its handler
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	}
	wait, stop := context.WithTimeout(context.Background(), 10*time.Second) // a stack dump takes milliseconds
	defer stop()
	for _, p := range ps {
		select {
		case <-p.done:
		case <-wait.Done():
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		h.mu.Lock()
		delete(h.procs, p.id)
		h.mu.Unlock()
	}
}

// unrelayed lists the outbox sources of db (the default tables of pgoutbox or sqliteoutbox,
// and of the fence store beside it) with rows not yet relayed, one line each: group, topic,
// partition, delivered / last sequence, and the fence the source stores.
func unrelayed(ctx context.Context, db DB) ([]string, error) {
	group := "group_id" // pgoutbox's and pgfence's column; sqliteoutbox and sqlitefence name it grp
	if db.Dialect() == SQLite {
		group = "grp"
	}
	rows, err := db.Query(ctx, `SELECT c.`+group+`, c.topic, c.partition, c.delivered_seq, c.last_seq,
    COALESCE(f.era, -1), COALESCE(f.epoch, -1)
FROM baton_outbox_cursors c LEFT JOIN baton_fences f
  ON f.`+group+` = c.`+group+` AND f.topic = c.topic AND f.partition = c.partition
WHERE c.last_seq > c.delivered_seq ORDER BY 1, 2, 3`)
	if err != nil {
		return nil, fmt.Errorf("reading the outbox cursors: %w", err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var g, t string
		var p int32
		var delivered, last, era, epoch int64
		if err := rows.Scan(&g, &t, &p, &delivered, &last, &era, &epoch); err != nil {
			return nil, fmt.Errorf("reading the outbox cursors: %w", err)
		}
		lines = append(lines, fmt.Sprintf("  %s %s %d: %d / %d; fence %d.%d", g, t, p, delivered, last, era, epoch))
	}
	return lines, rows.Err()
}
