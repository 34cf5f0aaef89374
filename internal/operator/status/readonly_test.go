package status

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/batonhq/baton/internal/testkit/testenv"
)

// TestReadOnlyStoreFollowsThePrimary opens the store read-only through a URL with
// target_session_attrs=read-write (the form a multi-host URL that follows the primary takes):
// it connects, reads, and refuses to write.
func TestReadOnlyStoreFollowsThePrimary(t *testing.T) {
	url := testenv.PostgresURL(t)
	sep := "?"
	for _, c := range url {
		if c == '?' {
			sep = "&"
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := OpenStore(ctx, url+sep+"target_session_attrs=read-write", Tables{}, ReadOnly)
	if err != nil {
		t.Fatalf("read-only store behind target_session_attrs=read-write: %v", err)
	}
	defer s.Close()
	var one int
	if err := s.pg.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("read: %d, %v", one, err)
	}
	_, err = s.pg.Exec(ctx, "CREATE TEMP TABLE read_only_probe (i int)")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" { // read_only_sql_transaction
		t.Fatalf("a write through the read-only store: %v, want SQLSTATE 25006", err)
	}
}
