package wan

import (
	"context"
	"net"
)

// DialInNetns wraps dial so that each call runs on a thread inside network
// namespace ns (a packet path's ClientNetns): the sockets it creates belong
// to that namespace and so cross the emulated path. An empty ns returns
// dial unchanged. The result fits pgconn.Config.DialFunc.
func DialInNetns(ns string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if ns == "" {
		return dial
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := InNetns(ns, func() error {
			var err error
			conn, err = dial(ctx, network, addr)
			return err
		})
		return conn, err
	}
}
