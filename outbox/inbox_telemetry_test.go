package outbox_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/outbox"
)

// An inbox starts a span for every admission ("inbox admit <topic>") from the tracer provider
// given to NewInbox, as a relay's publish spans come from the one given to NewRelay.
func TestInboxTakesItsTracerProvider(t *testing.T) {
	store, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	in, err := outbox.NewInbox[*memfence.Tx]("receiver", store, outbox.Telemetry(nil, sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx, err := store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v, err := in.Admit(ctx, tx, relayed("invoices", 0, fence.Key{Group: "g", Topic: "orders"}, fence.Token{Epoch: 1}, 1, "k"))
	if err != nil || v != fence.Admitted {
		t.Fatalf("Admit = %v, %v; want Admitted", v, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	ended := rec.Ended()
	if len(ended) != 1 || ended[0].Name() != "inbox admit invoices" {
		var names []string
		for _, s := range ended {
			names = append(names, s.Name())
		}
		t.Fatalf("spans in the inbox's tracer provider: %q, want [\"inbox admit invoices\"]", names)
	}
}
