package edge_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"
	"time"

	"github.com/pgquic/pgquic/edge"
	"github.com/pgquic/pgquic/quicclient"
)

// A sidecar on 127.0.0.1:5433: psql "host=127.0.0.1 port=5433 dbname=app
// user=app" then reaches the pooler over QUIC, one stream per connection.
// This is what `pgquic edge` runs.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	d, err := quicclient.NewDialer(quicclient.DialerConfig{
		Addr:      "pooler.example.com:6432",
		PinSHA256: "3f1c…", // the server's certificate fingerprint
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close() // the edge does not close its Dialer

	e, err := edge.New(edge.Config{Listen: "127.0.0.1:5433", Dialer: d}, nil, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := e.Listen(); err != nil {
		log.Fatal(err)
	}
	go func() {
		<-ctx.Done()
		grace, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.Shutdown(grace) // lets local sessions finish, then cuts them
	}()
	if err := e.Serve(context.Background()); err != nil {
		log.Fatal(err)
	}
}
