package quicclient_test

import (
	"context"
	"database/sql"
	"log"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgquic/pgquic/quicclient"
)

// A pgx connection whose session is a QUIC stream to a pgquic pooler. The
// host in the URL is only a label: the Dialer knows the pooler's address,
// and LookupFunc keeps pgx from resolving the label. sslmode=disable is
// right here, since QUIC already encrypts. Every session, and every
// CancelRequest pgx sends, becomes a fresh stream.
func ExampleDialer() {
	ctx := context.Background()
	d, err := quicclient.NewDialer(quicclient.DialerConfig{
		Addr:      "pooler.example.com:6432",
		PinSHA256: "3f1c…", // the server's certificate fingerprint; or CAFile: "ca.pem"
	}, slog.Default())
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()

	cfg, err := pgx.ParseConfig("postgres://app@quic/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	cfg.DialFunc = d.DialFunc()
	cfg.LookupFunc = d.LookupFunc()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
}

// A pgxpool pool: each pooled connection is one stream, all of them shared
// over the Dialer's few QUIC connections.
func ExampleDialer_pgxpool() {
	ctx := context.Background()
	d, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: "pooler.example.com:6432", CAFile: "ca.pem"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()

	cfg, err := pgxpool.ParseConfig("postgres://app@quic/app?sslmode=disable&pool_max_conns=100")
	if err != nil {
		log.Fatal(err)
	}
	cfg.ConnConfig.DialFunc = d.DialFunc()
	cfg.ConnConfig.LookupFunc = d.LookupFunc()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
}

// database/sql through pgx's stdlib driver.
func ExampleDialer_databaseSQL() {
	d, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: "pooler.example.com:6432", CAFile: "ca.pem"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()

	cfg, err := pgx.ParseConfig("postgres://app@quic/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	cfg.DialFunc = d.DialFunc()
	cfg.LookupFunc = d.LookupFunc()
	var db *sql.DB = stdlib.OpenDB(*cfg)
	defer db.Close()
}
