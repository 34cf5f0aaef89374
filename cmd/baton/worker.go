package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/chaos"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/outbox/pgoutbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

func worker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	var (
		cfg            chaos.WorkerConfig
		mode, brokers  string
		pgURL, sqlPath string
	)
	fs.StringVar(&cfg.ID, "id", "", "worker id")
	fs.StringVar(&mode, "mode", "fenced", "fenced, unfenced or lock")
	fs.StringVar(&brokers, "brokers", "", "Kafka seed brokers, comma-separated")
	fs.StringVar(&cfg.Group, "group", "", "consumer group")
	fs.StringVar(&cfg.Topic, "topic", "", "topic")
	fs.StringVar(&pgURL, "postgres", "", "PostgreSQL URL")
	fs.StringVar(&sqlPath, "sqlite", "", "SQLite file")
	fs.StringVar(&cfg.RedisAddr, "redis", "", "Redis address (lock mode)")
	fs.DurationVar(&cfg.SessionTimeout, "session-timeout", 3*time.Second, "Kafka session timeout")
	fs.StringVar(&cfg.CommandsTopic, "commands", "", "topic for commands sent through the outbox (fenced mode)")
	fs.IntVar(&cfg.CommandEvery, "command-every", 0, "send a command for every record whose sequence is a multiple of this")
	if err := fs.Parse(args); err != nil {
		return err
	}
	m, err := chaos.ParseMode(mode)
	if err != nil {
		return err
	}
	cfg.Mode = m
	cfg.Brokers = strings.Split(brokers, ",")
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("worker", cfg.ID)
	switch {
	case pgURL != "" && sqlPath == "":
		pcfg, err := pgxpool.ParseConfig(pgURL)
		if err != nil {
			return err
		}
		// A transaction held open by a frozen process keeps the fence row locked and so
		// blocks the takeover; the database ends it after this long (DESIGN.md).
		pcfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt((2 * cfg.SessionTimeout).Milliseconds(), 10)
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return err
		}
		defer pool.Close()
		db := chaos.PgDB(pool)
		if m != chaos.Fenced {
			return chaos.RunBaseline(ctx, cfg, db)
		}
		store, err := pgfence.New(pool)
		if err != nil {
			return err
		}
		box, err := pgoutbox.New(pool) // tables created by whoever started the run
		if err != nil {
			return err
		}
		return chaos.RunFenced[pgx.Tx](ctx, cfg, store, chaos.PgTx, db, box)
	case sqlPath != "" && pgURL == "":
		store, err := sqlitefence.Open(sqlPath)
		if err != nil {
			return err
		}
		defer store.Close()
		db := chaos.SQLDB(store.DB())
		if m != chaos.Fenced {
			return chaos.RunBaseline(ctx, cfg, db)
		}
		box, err := sqliteoutbox.New(store.DB())
		if err == nil {
			err = box.Migrate(ctx)
		}
		if err != nil {
			return err
		}
		return chaos.RunFenced[*sql.Tx](ctx, cfg, store, chaos.SQLTx, db, box)
	}
	return fmt.Errorf("give exactly one of -postgres and -sqlite")
}
