package main

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/quicclient"
)

// TestShowClientsFollowsMigration: a QUIC client that moves to another
// local address (quicclient.Dialer.Migrate) keeps its session, and the
// admin console's SHOW CLIENTS names the new address, not the one it
// connected from.
func TestShowClientsFollowsMigration(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	cfg := testConfig(cluster.SuperURL("postgres"))
	cfg.AdminUsers = config.UserList{"admin"}
	srv, _, _ := startTestServer(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	d, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: srv.quic.Addr().String(), Conns: 1, PinSHA256: srv.quic.Fingerprint()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pcfg := quictest.PgConfigURL(t, d, fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable&application_name=mover", cluster.SuperUser, cluster.SuperPassword, srv.quic.Addr()))
	c, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	mover := func() (addr, port string) {
		h, rows, err := psqlTable(ctx, t, srv.tcp.Addr().String(), "admin", "SHOW CLIENTS")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if cell(t, h, r, "application_name") == "mover" {
				return cell(t, h, r, "addr"), cell(t, h, r, "port")
			}
		}
		t.Fatalf("SHOW CLIENTS lacks the QUIC client: %v", rows)
		return "", ""
	}
	if addr, _ := mover(); addr != "127.0.0.1" {
		t.Fatalf("before the move: addr %s", addr)
	}
	if err := d.Migrate(ctx, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)}); err != nil {
		t.Fatal(err)
	}
	// The server switches to the new path at the client's next packet.
	if _, err := c.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatalf("the session after the move: %v", err)
	}
	var port string
	waitFor(t, func() bool {
		var addr string
		addr, port = mover()
		return addr == "127.0.0.2"
	})
	if port == "" || port == "0" {
		t.Errorf("after the move: port %q", port)
	}
}
