package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/redisfence"
	"github.com/batonhq/baton/outbox"
)

// serve runs one long-running member of the twins group on real services: the consumer folds
// device updates into the twins table and the relay publishes their commands (with -redis: into
// the twins' hashes, the commands into the devices' streams, no relay), until ctx ends
// (SIGTERM: the rebalance barrier commits or rolls back the in-flight batches). It serves
//
//	/metrics  Baton's metrics, Prometheus text format (metrics.go)
//	/healthz  200 while the consumer runs or is starting; 503 once Run failed
//	/readyz   200 when joined and every assigned partition is claimed, else 503 and why
//
// Spans go over OTLP/gRPC when the OTEL_* variables ask for it (traces.go).
//
// On PostgreSQL a member needs the tables -migrate creates; it does no DDL (its role may not).
func serve(ctx context.Context, o options, w io.Writer) error {
	log, err := newLogger(os.Stderr, o.logFormat, o.logLevel)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	service := os.Getenv("OTEL_SERVICE_NAME")
	if service == "" {
		service = "twin"
	}
	// Metrics go out through /metrics only: the deployment's collector is not sent a second
	// copy (deploy/README.md, "Metrics").
	mp, metrics, err := newMetrics(service)
	if err != nil {
		return err
	}
	defer func() { _ = mp.Shutdown(context.Background()) }()
	tp, shutdownTraces, err := tracesFromEnv(ctx, service)
	if err != nil {
		return err
	}
	defer func() { _ = shutdownTraces(context.Background()) }()
	n := namesWith(o.prefix, o.group)
	brokers := strings.Split(o.brokers, ",")
	kopts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
	if o.session > 0 {
		kopts = append(kopts, kgo.SessionTimeout(o.session))
	}
	if o.instanceID != "" {
		kopts = append(kopts, kgo.InstanceID(o.instanceID))
	}
	copts := []consumer.Option{consumer.Kafka(kopts...), consumer.Telemetry(mp, tp, nil), consumer.Logger(log)}
	var c interface {
		Run(context.Context) error
		Readiness() consumer.Readiness
	}
	if o.redis != "" {
		// On Redis the commands are written to the devices' streams by the fold: no relay.
		rt, err := openRedis(ctx, o.redis, o.redisLossy, n)
		if err != nil {
			return err
		}
		defer rt.c.Close()
		c, err = consumer.New(n.twins, []string{n.updates}, rt.store, nil, append(copts,
			consumer.PerPartition(func(context.Context, fence.Key, fence.Token) (consumer.Handler[*redisfence.Tx], error) {
				return foldRedis(rt), nil
			}))...)
		if err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
	} else {
		pool, err := pgxpool.New(ctx, o.pgURL)
		if err != nil {
			return fmt.Errorf("%w: PostgreSQL URL: %w", errUsage, err)
		}
		defer pool.Close()
		st, err := pgStore(pool)
		if err != nil {
			return err
		}
		producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		defer producer.Close()
		relay, err := outbox.NewRelay(producer, st.outbox, outbox.Telemetry(mp, tp))
		if err != nil {
			return err
		}
		c, err = consumer.New(n.twins, []string{n.updates}, st.fast, nil, append(copts,
			consumer.PerPartition(func(context.Context, fence.Key, fence.Token) (consumer.Handler[pgx.Tx], error) {
				return fold(st, n.commands), nil
			}),
			consumer.AfterCommit(relay.AfterCommit(), time.Second))...)
		if err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
	}

	ln, err := net.Listen("tcp", o.serve)
	if err != nil {
		return fmt.Errorf("%w: -serve %s: %w", errUsage, o.serve, err)
	}
	h := &probes{ready: c.Readiness}
	srv := &http.Server{Handler: h.mux(metrics), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(w, "twin: member of group %s on %s (topic %s), instance %q; http://%s/metrics, /healthz, /readyz\n",
		n.twins, o.brokers, n.updates, o.instanceID, ln.Addr())

	runErr := c.Run(ctx)
	h.failed(runErr)
	if runErr != nil {
		log.Error("consumer stopped", "err", runErr)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err = errors.Join(runErr, srv.Shutdown(sctx))
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// probes answers the liveness and readiness probes of a member.
type probes struct {
	ready func() consumer.Readiness
	mu    sync.Mutex
	err   error // Run's error, once it returned one
}

func (p *probes) failed(err error) {
	if err != nil {
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
	}
}

func (p *probes) mux(metrics http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		p.mu.Lock()
		err := p.err
		p.mu.Unlock()
		if err != nil {
			http.Error(w, "run failed: "+oneLine(err), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		rd := p.ready()
		if !rd.Ready() {
			http.Error(w, oneLine(errors.New(rd.String())), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, rd.String())
	})
	return mux
}

// oneLine keeps a probe's answer on one line, whatever the error says.
func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

// migrate creates the program's tables in PostgreSQL and grants the runtime role its rights
// (run it as the migration role, before the members start).
func migrate(ctx context.Context, o options, w io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, o.pgURL)
	if err != nil {
		return fmt.Errorf("%w: PostgreSQL URL: %w", errUsage, err)
	}
	defer pool.Close()
	if err := migratePostgres(ctx, pool, o.appRole); err != nil {
		return err
	}
	granted := "no runtime role granted"
	if o.appRole != "" {
		granted = "runtime role " + o.appRole + " granted SELECT, INSERT, UPDATE (and the outbox's DELETE)"
	}
	fmt.Fprintf(w, "twin: migrated (baton_fences, baton_fences_recoveries, baton_fences_keyed, baton_outbox and its tables, twins, applied); %s\n", granted)
	return nil
}
