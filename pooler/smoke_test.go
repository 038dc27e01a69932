package pooler_test

import (
	"context"
	"testing"
	"time"
)

func TestSmokeQueries(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := h.connect(ctx, t)
	for i := range 50 {
		var n int
		if err := conn.QueryRow(ctx, "select $1::int + 1", i).Scan(&n); err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		if n != i+1 {
			t.Fatalf("got %d want %d", n, i+1)
		}
	}
	if _, err := conn.Exec(ctx, "select 1; select 2"); err != nil {
		t.Fatal(err)
	}
}
