package quicfront

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/quicclient"
)

// TestMaxStreamsRefused checks the front-wide stream bound: with MaxStreams
// 2 and two sessions open, a third stream starts no session and gets FATAL
// 53300; a CancelRequest beyond the limit is still served (the running query
// ends with 57014); when the slots for answering streams beyond the limit
// are all busy, a stream is reset with quicclient.ErrCodeTooManyStreams; and once a
// session ends, a new one gets in.
func TestMaxStreamsRefused(t *testing.T) {
	h := quictest.NewScriptedPG()
	s := startServer(t, ServerConfig{MaxStreams: 2}, h)
	d := newTestDialer(t, quicclient.DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c1 := quictest.Connect(t, ctx, d)
	c2, err := pgconn.ConnectConfig(ctx, quictest.PgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	sleepDone := make(chan error, 1)
	go func() {
		_, err := c1.Exec(ctx, "select pg_sleep(60)").ReadAll()
		sleepDone <- err
	}()
	select {
	case <-h.Sleeping:
	case <-ctx.Done():
		t.Fatal("session 1 never started sleeping")
	}

	// A third session is refused before any session is allocated for it.
	_, err = pgconn.ConnectConfig(ctx, quictest.PgConfig(t, d))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "53300" {
		t.Fatalf("third session: %v, want PgError 53300", err)
	}
	served := len(h.Peers())
	if served != 2 {
		t.Fatalf("handler ran %d sessions, want 2", served)
	}
	if got := quictest.GaugeValue(t, s.reg, "pgquic_quic_streams"); got != 2 {
		t.Fatalf("streams gauge = %v, want 2", got)
	}

	// The CancelRequest for session 1 arrives beyond the limit and is served.
	if err := c1.CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-sleepDone; !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("cancelled sleep: %v, want 57014", err)
	}
	if h.Cancels.Load() != 1 {
		t.Fatalf("cancels = %d, want 1", h.Cancels.Load())
	}

	// With every slot for streams beyond the limit busy, a stream is reset
	// at once.
	for range limitSlots {
		s.limit <- struct{}{}
	}
	c, err := d.Dial(ctx)
	if err == nil {
		_, _ = c.Write(quictest.StartupBytes())
		_, err = c.Read(make([]byte, 1))
		_ = c.Close()
	}
	for range limitSlots {
		<-s.limit
	}
	if code, ok := quicclient.RemoteErrorCode(err); !ok || code != quicclient.ErrCodeTooManyStreams {
		t.Fatalf("stream beyond the limit with no slot left: %v, want reset with too_many_streams", err)
	}
	if got := quictest.GaugeValue(t, s.reg, "pgquic_quic_streams_refused_total"); got != 2 {
		t.Fatalf("streams_refused_total = %v, want 2", got)
	}

	// A session ends; the next one gets in.
	if err := c2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	quictest.Eventually(t, 10*time.Second, "session 2 to end", func() bool {
		return quictest.GaugeValue(t, s.reg, "pgquic_quic_streams") == 1
	})
	c3, err := pgconn.ConnectConfig(ctx, quictest.PgConfig(t, d))
	if err != nil {
		t.Fatalf("after a session ended: %v", err)
	}
	if got, err := quictest.QueryInt(ctx, c3, 5); err != nil || got != "5" {
		t.Fatalf("new session: %q %v", got, err)
	}
	_ = c3.Close(ctx)
}
