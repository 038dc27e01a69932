package pooler

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// oracleConn is a bare simple-protocol connection to PostgreSQL for the
// differential oracle (oracle_test.go). It talks the wire protocol itself,
// rather than through pgconn, because the oracle feeds it arbitrary text:
// a COPY FROM STDIN must get its data or a CopyFail instead of hanging, a
// COPY TO STDOUT must be drained, every ParameterStatus the server sends
// must be seen (the pooler learns some changes from them), and a statement
// that outlives its time must be cancelled on the server, not merely
// abandoned.
type oracleConn struct {
	nc      net.Conn
	fe      *pgproto3.Frontend
	sock    string
	pid     uint32
	secret  []byte
	status  byte          // transaction status of the last ReadyForQuery
	timeout time.Duration // how long one Query may take before it is cancelled
}

// oracleResult is what one simple Query produced.
type oracleResult struct {
	err      *pgproto3.ErrorResponse // the first error, nil when none
	rows     []string                // the first column of every DataRow, when collected
	reported map[string]string       // ParameterStatus the server sent meanwhile
}

// dialOracle opens a session as the cluster's superuser over its Unix
// socket (always trusted) in database db, with extra startup parameters.
func dialOracle(c *pgtest.Cluster, db string, params map[string]string) (*oracleConn, error) {
	sock := filepath.Join(c.SocketDir, ".s.PGSQL."+strconv.Itoa(c.Port))
	nc, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("oracle: dial: %w", err)
	}
	oc := &oracleConn{nc: nc, fe: pgproto3.NewFrontend(nc, nc), sock: sock, timeout: 60 * time.Second}
	p := map[string]string{"user": c.SuperUser, "database": db}
	for k, v := range params {
		p[k] = v
	}
	oc.fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: p})
	if err := oc.fe.Flush(); err != nil {
		nc.Close()
		return nil, fmt.Errorf("oracle: startup: %w", err)
	}
	_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
	for {
		msg, err := oc.fe.Receive()
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("oracle: startup: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.BackendKeyData:
			oc.pid, oc.secret = m.ProcessID, bytes.Clone(m.SecretKey)
		case *pgproto3.ErrorResponse:
			nc.Close()
			return nil, fmt.Errorf("oracle: startup: %s %s", m.Code, m.Message)
		case *pgproto3.ReadyForQuery:
			oc.status = m.TxStatus
			_ = nc.SetDeadline(time.Time{})
			return oc, nil
		}
	}
}

// Close ends the session.
func (oc *oracleConn) Close() error {
	oc.fe.Send(&pgproto3.Terminate{})
	_ = oc.fe.Flush()
	return oc.nc.Close()
}

// exec runs sql as one simple Query and waits for its ReadyForQuery. A
// COPY FROM STDIN gets copyData (a CopyFail when nil); rows are collected
// when collect is set. A Query still running after oc.timeout is
// cancelled; an error means the session is unusable and must be closed.
func (oc *oracleConn) exec(sql string, copyData []byte, collect bool) (oracleResult, error) {
	oc.fe.Send(&pgproto3.Query{String: sql})
	if err := oc.fe.Flush(); err != nil {
		return oracleResult{}, fmt.Errorf("oracle: send: %w", err)
	}
	res, _, err := oc.read(copyData, collect)
	return res, err
}

// execThen sends sql and, in the same write, then, whose rows it collects:
// one round trip where exec would take two, which matters on a loaded
// machine. then runs whatever sql left behind (inside an open block, or
// failing in an aborted one); the caller decides whether its answer means
// anything. When sql starts a COPY FROM STDIN, the server takes then's
// Query for a protocol error in the copy, so then never runs: thenRan is
// false.
func (oc *oracleConn) execThen(sql, then string) (res, thenRes oracleResult, thenRan bool, err error) {
	oc.fe.Send(&pgproto3.Query{String: sql})
	oc.fe.Send(&pgproto3.Query{String: then})
	if err := oc.fe.Flush(); err != nil {
		return res, thenRes, false, fmt.Errorf("oracle: send: %w", err)
	}
	res, copied, err := oc.read(nil, false)
	if err != nil || copied {
		return res, thenRes, false, err
	}
	thenRes, _, err = oc.read(nil, true)
	return res, thenRes, err == nil, err
}

// read reads one Query's answer up to its ReadyForQuery, answering a COPY
// FROM STDIN with copyData or a CopyFail; copied reports that one came.
func (oc *oracleConn) read(copyData []byte, collect bool) (res oracleResult, copied bool, err error) {
	cancelled := false
	_ = oc.nc.SetReadDeadline(time.Now().Add(oc.timeout))
	for {
		msg, err := oc.fe.Receive()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !cancelled {
				cancelled = true
				if cerr := oc.cancel(); cerr != nil {
					return res, copied, cerr
				}
				_ = oc.nc.SetReadDeadline(time.Now().Add(15 * time.Second))
				continue
			}
			return res, copied, fmt.Errorf("oracle: receive: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			if collect && len(m.Values) > 0 {
				res.rows = append(res.rows, string(m.Values[0]))
			}
		case *pgproto3.ErrorResponse:
			if res.err == nil {
				e := *m
				res.err = &e
			}
		case *pgproto3.ParameterStatus:
			if res.reported == nil {
				res.reported = map[string]string{}
			}
			res.reported[m.Name] = m.Value
		case *pgproto3.CopyInResponse:
			copied = true
			if copyData != nil {
				oc.fe.Send(&pgproto3.CopyData{Data: copyData})
				oc.fe.Send(&pgproto3.CopyDone{})
				copyData = nil
			} else {
				oc.fe.Send(&pgproto3.CopyFail{Message: "oracle: no COPY data"})
			}
			if err := oc.fe.Flush(); err != nil {
				return res, copied, fmt.Errorf("oracle: send: %w", err)
			}
		case *pgproto3.CopyBothResponse:
			oc.fe.Send(&pgproto3.CopyDone{})
			if err := oc.fe.Flush(); err != nil {
				return res, copied, fmt.Errorf("oracle: send: %w", err)
			}
		case *pgproto3.ReadyForQuery:
			oc.status = m.TxStatus
			return res, copied, nil
		}
	}
}

// cancel asks the server, over a second socket, to cancel the running Query.
func (oc *oracleConn) cancel() error {
	nc, err := net.DialTimeout("unix", oc.sock, 10*time.Second)
	if err != nil {
		return fmt.Errorf("oracle: cancel: %w", err)
	}
	defer nc.Close()
	fe := pgproto3.NewFrontend(nc, nc)
	fe.Send(&pgproto3.CancelRequest{ProcessID: oc.pid, SecretKey: oc.secret})
	if err := fe.Flush(); err != nil {
		return fmt.Errorf("oracle: cancel: %w", err)
	}
	// The server closes the socket once it has read the request.
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = nc.Read(make([]byte, 1))
	return nil
}
