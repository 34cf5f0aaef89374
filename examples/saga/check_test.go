package main

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonhq/baton/consumer/chaos"
	"github.com/batonhq/baton/fence/sqlitefence"
)

// TestCheckCatches: each invariant fails on a database that breaks it, and only that one (or
// the ones the break implies), and a correct order passes them all. The run tests show the
// checker passing fenced runs and failing unfenced ones; this shows every invariant can fail.
func TestCheckCatches(t *testing.T) {
	completed := func(x *fixture) {
		x.log("placed", "reserved", "charged", "shipped")
		x.exec(`INSERT INTO stock_moves (order_id, kind, worker, at_ms) VALUES ('o000000', 'reserve', 'w1', 0)`)
		x.psp(`INSERT INTO psp_ledger (order_id, kind, amount, idem_key, worker, at_ms) VALUES ('o000000', 'charge', 100, 'k1', 'w1', 0)`)
		x.exec(`INSERT INTO shipments (order_id, worker, at_ms) VALUES ('o000000', 'w1', 0)`)
	}
	for _, tc := range []struct {
		name  string
		setup func(x *fixture)
		want  map[string]int64 // violations by invariant; every other invariant must hold
	}{
		{"completed order", completed, nil},
		{"failed order, compensated", func(x *fixture) {
			x.log("placed", "reserved", "timeout")
			x.exec(`INSERT INTO stock_moves (order_id, kind, worker, at_ms) VALUES ('o000000', 'reserve', 'w1', 0), ('o000000', 'release', 'w1', 1)`)
			x.psp(`INSERT INTO psp_ledger (order_id, kind, amount, idem_key, worker, at_ms) VALUES ('o000000', 'charge', 100, 'k1', 'w1', 0), ('o000000', 'refund', 100, 'k2', 'w1', 1)`)
		}, nil},
		{"charged twice", func(x *fixture) {
			completed(x)
			x.psp(`INSERT INTO psp_ledger (order_id, kind, amount, idem_key, worker, at_ms) VALUES ('o000000', 'charge', 100, NULL, 'w2', 1)`)
		}, map[string]int64{invChargedTwice: 1, invOutcomeEffects: 1}},
		{"refund without a charge", func(x *fixture) {
			x.log("placed", "rejected")
			x.psp(`INSERT INTO psp_ledger (order_id, kind, amount, idem_key, worker, at_ms) VALUES ('o000000', 'refund', 100, 'k2', 'w1', 1)`)
		}, map[string]int64{invOrphanRefund: 1, invCompensations: 1, invOutcomeEffects: 1}},
		{"shipped and refunded", func(x *fixture) {
			completed(x)
			x.psp(`INSERT INTO psp_ledger (order_id, kind, amount, idem_key, worker, at_ms) VALUES ('o000000', 'refund', 100, 'k2', 'w1', 1)`)
		}, map[string]int64{invShippedRefund: 1, invOutcomeEffects: 1}},
		{"no terminal state", func(x *fixture) {
			x.log("placed", "reserved")
			x.exec(`INSERT INTO stock_moves (order_id, kind, worker, at_ms) VALUES ('o000000', 'reserve', 'w1', 0)`)
		}, map[string]int64{invOneTerminal: 1}},
		{"release without a reservation", func(x *fixture) {
			x.log("placed", "rejected")
			x.exec(`INSERT INTO stock_moves (order_id, kind, worker, at_ms) VALUES ('o000000', 'release', 'w1', 0)`)
		}, map[string]int64{invCompensations: 1, invOutcomeEffects: 1}},
		{"a step out of order", func(x *fixture) {
			completed(x)
			x.exec(`UPDATE saga_log SET n = 5 WHERE n = 3`)
		}, map[string]int64{invStepOrder: 1}},
		{"a shipment without a charge", func(x *fixture) {
			completed(x)
			x.psp(`DELETE FROM psp_ledger`)
		}, map[string]int64{invStepOrder: 1, invOutcomeEffects: 1}},
		{"failed but still charged", func(x *fixture) {
			x.log("placed", "reserved", "declined")
			x.exec(`INSERT INTO stock_moves (order_id, kind, worker, at_ms) VALUES ('o000000', 'reserve', 'w1', 0), ('o000000', 'release', 'w1', 1)`)
			x.psp(`INSERT INTO psp_ledger (order_id, kind, amount, idem_key, worker, at_ms) VALUES ('o000000', 'charge', 100, 'k1', 'w1', 0)`)
		}, map[string]int64{invOutcomeEffects: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newFixture(t)
			tc.setup(x)
			inv, err := x.saga.Check(context.Background(), x.env)
			if err != nil {
				t.Fatal(err)
			}
			if len(inv) != 7 {
				t.Fatalf("%d invariants, want 7", len(inv))
			}
			for _, i := range inv {
				if i.Violations != tc.want[i.Name] {
					t.Errorf("%s: %d violations, want %d (%s)", i.Name, i.Violations, tc.want[i.Name], i.Example)
				}
			}
		})
	}
}

// TestCheckSaysWhereOrdersStopped: the example of an unended order says where the orders that
// did not end stopped (state, partition and worker of the last transition).
func TestCheckSaysWhereOrdersStopped(t *testing.T) {
	x := newFixture(t)
	x.log("placed", "reserved")
	inv, err := x.saga.Check(context.Background(), x.env)
	if err != nil {
		t.Fatal(err)
	}
	want := `not ended: 1 in "CHARGING", last moved on t/0 by w1`
	for _, i := range inv {
		if i.Name == invOneTerminal && !strings.Contains(i.Example, want) {
			t.Errorf("%s: example %q, want it to say %q", i.Name, i.Example, want)
		}
	}
}

type fixture struct {
	t     *testing.T
	saga  *Saga
	env   chaos.Env
	db    *sql.DB
	pspDB chaos.DB
}

func newFixture(t *testing.T) *fixture {
	path := filepath.Join(t.TempDir(), "saga.db")
	store, err := sqlitefence.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	x := &fixture{t: t, saga: &Saga{}, env: chaos.Env{DB: chaos.SQLDB(store.DB()), SQLitePath: path}, db: store.DB()}
	if err := x.saga.Migrate(context.Background(), x.env); err != nil {
		t.Fatal(err)
	}
	p, closePSP, err := openPSP(context.Background(), x.env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closePSP)
	x.pspDB = p.db
	x.saga.produced.Store(1) // order o000000
	return x
}

func (x *fixture) exec(q string) {
	x.t.Helper()
	if err := x.env.DB.Exec(context.Background(), q); err != nil {
		x.t.Fatalf("%s: %v", q, err)
	}
}

func (x *fixture) psp(q string) {
	x.t.Helper()
	if err := x.pspDB.Exec(context.Background(), q); err != nil {
		x.t.Fatalf("%s: %v", q, err)
	}
}

// log records order o000000's saga through events, as the orchestrator would.
func (x *fixture) log(events ...string) {
	x.t.Helper()
	state := ""
	for i, ev := range events {
		to := transitions[state][ev]
		if to == "" {
			x.t.Fatalf("no transition from %q on %q", state, ev)
		}
		if err := x.env.DB.Exec(context.Background(), `INSERT INTO saga_log (order_id, n, from_state, to_state, event, worker, era, epoch, topic, part, off, at_ms)
VALUES ('o000000', $1, $2, $3, $4, 'w1', 0, 1, 't', 0, $1, 0)`, i+1, state, to, ev); err != nil {
			x.t.Fatal(err)
		}
		state = to
	}
	x.exec(`INSERT INTO saga_orders (order_id, state, steps, amount, script) VALUES ('o000000', '` + state + `', 0, 100, 'ok')`)
}
