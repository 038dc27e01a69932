package backend

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/puddle/v2"

	"github.com/pgquic/pgquic/internal/rawsock"
	"github.com/pgquic/pgquic/internal/wire"
)

// Conn is one warm, authenticated server connection. While a client holds it
// (between Pool.Acquire and Release/Destroy) that client's session goroutine
// owns every field; the pool touches it only when it is idle.
type Conn struct {
	// R reads the server's messages. W buffers messages to the server; the
	// holder must Flush it.
	R *wire.Reader
	W *bufio.Writer

	// PID and SecretKey identify the server process, as sent in its
	// BackendKeyData; Pool.Cancel needs them.
	PID       uint32
	SecretKey []byte

	// Params holds the server's current ParameterStatus values. The holder
	// keeps it up to date as ParameterStatus messages pass by, so the pooler
	// can tell when a client's settings differ from this server's. Changes
	// go through SetParam, which counts them (ParamsGen).
	Params map[string]string
	// paramsGen counts the changes to Params (SetParam).
	paramsGen uint64

	// ServerDefaults holds the ParameterStatus values the server sent when
	// the connection logged in: the database's and role's defaults (ALTER
	// DATABASE/ROLE ... SET included) as of that moment. It is never
	// modified; Pool.ServerParams hands it out.
	ServerDefaults map[string]string

	// State belongs to the pooler layer (its per-server prepared statement
	// cache). The backend package never reads it and drops it with the
	// connection.
	State any

	netConn   net.Conn
	pool      *Pool
	createdAt time.Time
	lastUsed  time.Time

	// res is the puddle resource while the conn is checked out; nil once it
	// has been released or destroyed. Release and Destroy swap it out
	// atomically, so a second call, even from another goroutine tearing the
	// session down, is a no-op.
	res atomic.Pointer[puddle.Resource[*Conn]]

	// tlsConfig is the TLS configuration the connection was negotiated with
	// (nil for plaintext); network and address are where it was dialed. Cancel
	// uses them to reach the same server the same way.
	tlsConfig *tls.Config
	network   string
	address   string

	// raw gives access to the socket for the liveness peek; nil when the
	// transport exposes no file descriptor. peekFn is the bound method value,
	// created once so that each peek allocates nothing.
	raw     syscall.RawConn
	peekFn  func(fd uintptr) bool
	peekN   int
	peekErr error
	peekBuf [1]byte

	flushFn func() error // c.flushThen, bound once for FlushOnRead
	then    func()       // FlushOnRead's then, until the flush has run
}

// NetConn returns the underlying connection, so the holder can set deadlines
// or close it to unblock a read when the session is torn down.
func (c *Conn) NetConn() net.Conn { return c.netConn }

// Pool returns the pool this connection belongs to.
func (c *Conn) Pool() *Pool { return c.pool }

// ObserveQuery records in the pool's query duration histogram how long the
// server took to answer one request, up to its ReadyForQuery. The holder
// measures it, since only the holder knows where a request starts.
func (c *Conn) ObserveQuery(d time.Duration) {
	if c.pool != nil {
		c.pool.metrics.observeQuery(d)
	}
}

// ObserveTransaction records in the pool's transaction duration histogram
// how long a transaction held this connection, from its first request to the
// ReadyForQuery that ended it.
func (c *Conn) ObserveTransaction(d time.Duration) {
	if c.pool != nil {
		c.pool.metrics.observeTransaction(d)
	}
}

// Release returns the connection to its pool. The caller guarantees the
// connection is idle: ReadyForQuery with status 'I' has been read, every
// response has been consumed and W has been flushed. A connection past its
// ServerLifetime, one of a template database (see template.go), or one that
// still has buffered bytes (a broken promise that would hand the next client
// someone else's data), is destroyed instead.
// Calling Release or Destroy again afterwards does nothing.
func (c *Conn) Release() { c.ReleaseAt(time.Now()) }

// ReleaseAt is Release for a holder that has just read the clock (the
// pooler at the ReadyForQuery that ends a request): now, which must be
// no older than that, stands for the release time in the lifetime check
// and as the connection's last use, so the release reads no clock of its
// own.
func (c *Conn) ReleaseAt(now time.Time) {
	res := c.res.Swap(nil)
	if res == nil {
		return
	}
	p := c.pool
	p.lent.Add(-1)
	if c.R.Buffered() != 0 || c.W.Buffered() != 0 {
		p.logger.Warn("backend: connection released with buffered data; destroying it",
			"pid", c.PID, "read_buffered", c.R.Buffered(), "write_buffered", c.W.Buffered())
		p.destroyRes(res, reasonError)
		p.notifyReleased()
		return
	}
	if now.Sub(c.createdAt) > p.cfg.ServerLifetime {
		p.destroyRes(res, reasonLifetime)
		p.notifyReleased()
		return
	}
	if p.template.Load() {
		p.destroyRes(res, reasonTemplate) // see template.go
		p.notifyReleased()
		return
	}
	c.lastUsed = now
	res.Release()
	p.notifyReleased()
}

// FlushOnRead hands the flush of W to the next read of the server's socket,
// which then flushes from inside its wait in the network poller and skips
// the read that would find nothing before the reply (see
// rawsock.Conn.BeforeRead), and reports true; on a connection whose socket
// is not read with raw system calls (TLS), or with replies already
// buffered, it does nothing and reports false, and the caller flushes.
//
// The holder calls it only when its own next action is that read, and only
// for a request that has a reply to come: the read waits for one. then, if
// not nil, runs after the flush, whatever its outcome (a pipelining holder
// lets the next request be written behind its own).
func (c *Conn) FlushOnRead(then func()) bool {
	rc, ok := c.netConn.(*rawsock.Conn)
	if !ok || c.R.Buffered() != 0 {
		return false
	}
	if c.flushFn == nil {
		c.flushFn = c.flushThen
	}
	c.then = then
	rc.BeforeRead(c.flushFn)
	return true
}

// flushThen is FlushOnRead's flush.
func (c *Conn) flushThen() error {
	err := c.W.Flush()
	if f := c.then; f != nil {
		c.then = nil
		f()
	}
	return err
}

// Expired reports whether the connection is past its ServerLifetime, so a
// holder that hands it on without a Release should release it instead (and
// Release will replace it).
func (c *Conn) Expired() bool {
	return c.pool != nil && time.Since(c.createdAt) > c.pool.cfg.ServerLifetime
}

// Destroy closes the connection and removes it from its pool. It is safe in
// any protocol state (mid-transaction, mid-COPY, after a read error); the
// server sees a Terminate or a closed socket and rolls back. Calling Release
// or Destroy again afterwards does nothing.
func (c *Conn) Destroy() {
	res := c.res.Swap(nil)
	if res == nil {
		return
	}
	c.pool.lent.Add(-1)
	c.pool.destroyRes(res, reasonError)
	c.pool.notifyReleased()
}

// initRaw finds the socket under the connection (under TLS too: while the
// connection is idle nothing may arrive at the socket either) for peeking.
func (c *Conn) initRaw() {
	nc := c.netConn
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	c.raw = raw
	c.peekFn = c.peekFD
}

// SetParam records a ParameterStatus value in Params and counts the
// change, so a holder that checked Params against its own settings can
// skip the check while ParamsGen is unchanged.
func (c *Conn) SetParam(name, value string) {
	if c.Params == nil {
		c.Params = make(map[string]string)
	}
	if v, ok := c.Params[name]; ok && v == value {
		return
	}
	c.Params[name] = value
	c.paramsGen++
}

// ParamsGen is the number of changes SetParam made to Params: equal
// values mean Params has not changed in between.
func (c *Conn) ParamsGen() uint64 { return c.paramsGen }

// errUnsolicited reports data from the server on a connection that should be
// silent: typically a FATAL ErrorResponse sent before the server closed it.
var errUnsolicited = errors.New("server sent unsolicited data on an idle connection")

// alive reports whether an idle connection still looks usable, without
// blocking and without a round trip: the server must not have sent anything
// (data means an unsolicited message such as FATAL "terminating connection
// due to administrator command"; end of file means it closed). When the
// transport exposes no socket it reports true and the round-trip health check
// has to find out.
func (c *Conn) alive() error {
	if c.R.Buffered() != 0 {
		return errUnsolicited
	}
	if c.raw == nil {
		return nil
	}
	if err := c.raw.Read(c.peekFn); err != nil {
		return fmt.Errorf("inspect socket: %w", err)
	}
	return c.peekResult()
}

// ping runs a full round trip: an empty Query, which the server answers with
// EmptyQueryResponse and ReadyForQuery. It proves the server process is alive
// and the connection is in sync, and bounds the wait by timeout and ctx.
// ParameterStatus messages that arrive on the way update Params.
func (c *Conn) ping(ctx context.Context, timeout time.Duration) error {
	if err := c.query(ctx, timeout, "", nil); err != nil {
		return fmt.Errorf("health check: %w", err)
	}
	return nil
}

// Query runs sql, a read-only statement of the pooler's own (never a
// client's), as a simple Query on an idle connection the caller holds, and
// hands each DataRow's body to row. sql may hold several statements, a
// transaction block of its own among them. It returns once the server is
// idle again, with the server's error if a statement failed: a block the
// failure left open is rolled back first. The wait is bounded by timeout
// and ctx. On any error that is not a *ServerError the connection is out
// of step with its server, and the caller destroys it.
func (c *Conn) Query(ctx context.Context, timeout time.Duration, sql string, row func(body []byte) error) error {
	err := c.query(ctx, timeout, sql, row)
	var se *ServerError
	if errors.As(err, &se) && se.status != 'I' {
		// The statements after the failed one were skipped, COMMIT too.
		if rerr := c.query(ctx, timeout, "ROLLBACK", nil); rerr != nil {
			return fmt.Errorf("roll back after %v: %w", err, rerr)
		}
	}
	return err
}

// query is Query; an empty sql expects EmptyQueryResponse (ping).
func (c *Conn) query(ctx context.Context, timeout time.Duration, sql string, row func([]byte) error) (err error) {
	restore, err := c.bound(ctx, timeout)
	if err != nil {
		return err
	}
	defer func() { err = restore(err) }()
	if err := c.writeQuery(sql); err != nil {
		return fmt.Errorf("write query: %w", err)
	}
	var st replyState
	for {
		typ, _, err := c.R.Next()
		if err != nil {
			return fmt.Errorf("read reply: %w", err)
		}
		if typ == 'Z' {
			return c.readyForQuery(&st)
		}
		if err := c.replyMessage(typ, sql == "", row, &st); err != nil {
			return err
		}
	}
}

// bound gives the socket the deadline of a query of the pooler's own: the
// sooner of timeout and ctx's deadline, and at once when ctx is cancelled.
// restore clears it again; it returns the query's error, or ctx's when
// the cancellation cut the query short, or the clearing's.
func (c *Conn) bound(ctx context.Context, timeout time.Duration) (restore func(error) error, err error) {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	nc := c.netConn
	if err := nc.SetDeadline(deadline); err != nil {
		return nil, fmt.Errorf("set deadline: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	return func(err error) error {
		if !stop() && err == nil {
			err = ctx.Err()
		}
		if derr := nc.SetDeadline(time.Time{}); derr != nil && err == nil {
			err = fmt.Errorf("clear deadline: %w", derr)
		}
		return err
	}, nil
}

// writeQuery writes sql as a Query message and flushes it; an empty sql is
// a Query with an empty string, which the server answers with
// EmptyQueryResponse.
func (c *Conn) writeQuery(sql string) error {
	var err error
	if sql == "" {
		// Query message with an empty query string: 'Q', length 5, "\x00".
		_, err = c.W.Write([]byte{'Q', 0, 0, 0, 5, 0})
	} else {
		b := append(wire.AppendHeader(make([]byte, 0, 6+len(sql)), 'Q', len(sql)+1), sql...)
		_, err = c.W.Write(append(b, 0))
	}
	if err != nil {
		return err
	}
	return c.W.Flush()
}

// replyState is what query has seen of the reply so far.
type replyState struct {
	failed error // the first error: the statement's, or row's
	done   bool  // the reply the statement owes came (EmptyQueryResponse or CommandComplete)
}

// replyMessage handles one message of a query's reply before its
// ReadyForQuery, whose header has just been read. An error of the
// statement's, or of row, is kept in st and the reply read on to
// ReadyForQuery, so the connection stays in sync; an error returned means
// it is not.
func (c *Conn) replyMessage(typ byte, ping bool, row func([]byte) error, st *replyState) error {
	switch typ {
	case 'I', 'C': // EmptyQueryResponse, CommandComplete
		st.done = st.done || (typ == 'I') == ping
		return c.skipReply()
	case 'T', 'N', 'A': // RowDescription, NoticeResponse, NotificationResponse
		return c.skipReply()
	case 'D', 'S', 'E': // DataRow, ParameterStatus, ErrorResponse: read below
	default:
		return fmt.Errorf("unexpected message type %q", typ)
	}
	body, err := c.R.Body()
	if err != nil {
		return fmt.Errorf("read reply: %w", err)
	}
	switch typ {
	case 'D':
		rerr := errors.New("unexpected DataRow")
		if row != nil {
			rerr = row(body)
		}
		if rerr != nil && st.failed == nil {
			st.failed = rerr
		}
	case 'S':
		if name, rest, ok := wire.CString(body); ok {
			if val, _, ok := wire.CString(rest); ok {
				c.SetParam(string(name), string(val))
			}
		}
	case 'E':
		if st.failed == nil {
			st.failed = &ServerError{msg: errorMessage(body)}
		}
		st.done = true
	}
	return nil
}

// skipReply passes over the reply message whose header was just read.
func (c *Conn) skipReply() error {
	if err := c.R.Skip(); err != nil {
		return fmt.Errorf("read reply: %w", err)
	}
	return nil
}

// readyForQuery reads the ReadyForQuery that ends a query's reply and
// returns the query's outcome: its first error (a statement's carries the
// transaction status that followed it), or nil when the statement
// completed and the connection is idle.
func (c *Conn) readyForQuery(st *replyState) error {
	body, err := c.R.Body()
	if err != nil {
		return fmt.Errorf("read reply: %w", err)
	}
	if st.failed != nil {
		if se, ok := st.failed.(*ServerError); ok && len(body) == 1 {
			se.status = body[0]
		}
		return st.failed
	}
	if !st.done || len(body) != 1 || body[0] != 'I' {
		return fmt.Errorf("unexpected ReadyForQuery (status %q, reply seen %v)", body, st.done)
	}
	return nil
}

// ServerError is the error of a statement Query ran: the server answered,
// and the connection is idle and in sync again.
type ServerError struct {
	msg    string
	status byte // the ReadyForQuery's transaction status that followed
}

func (e *ServerError) Error() string { return "server error: " + e.msg }

// errorMessage renders an ErrorResponse body as "SEVERITY CODE: message" for
// logs, without allocating a decoder.
func errorMessage(body []byte) string {
	var sev, code, msg []byte
	for len(body) > 0 && body[0] != 0 {
		field := body[0]
		val, rest, ok := wire.CString(body[1:])
		if !ok {
			break
		}
		switch field {
		case 'S':
			sev = val
		case 'C':
			code = val
		case 'M':
			msg = val
		}
		body = rest
	}
	return fmt.Sprintf("%s %s: %s", sev, code, msg)
}
