package pooler

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/internal/pgauth"
)

// ErrAuthFailed reports wrong or missing credentials. Sessions that fail with
// it get SQLSTATE 28P01, as PostgreSQL sends for a bad password. It is
// pgauth.ErrAuthFailed, which the methods of internal/pgauth wrap.
var ErrAuthFailed = pgauth.ErrAuthFailed

// ErrShuttingDown reports that the pooler is draining and takes no new
// transactions. Clients get SQLSTATE 57P01 (admin_shutdown).
var ErrShuttingDown = errors.New("pooler is shutting down")

// ErrServerLost reports that the server connection serving a client broke
// mid-transaction. The client gets SQLSTATE 08006 unless the server already
// told it why (57P01 after pg_terminate_backend, for instance).
var ErrServerLost = errors.New("server connection lost")

// PGError is an error destined for the client as an ErrorResponse. It wraps
// the cause so callers can still match it with errors.Is. The SQLSTATEs the
// pooler raises itself are the Code constants of internal/pgproto, which the
// fronts share.
type PGError struct {
	Severity string // ERROR or FATAL
	Code     string // SQLSTATE
	Message  string
	Detail   string
	Hint     string
	Err      error // cause, may be nil
}

// Error formats the error for logs: severity, SQLSTATE, message and cause.
func (e *PGError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s %s: %s: %v", e.Severity, e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s %s: %s", e.Severity, e.Code, e.Message)
}

// Unwrap returns the cause.
func (e *PGError) Unwrap() error { return e.Err }

func (e *PGError) response() *pgproto3.ErrorResponse {
	return &pgproto3.ErrorResponse{
		Severity:            e.Severity,
		SeverityUnlocalized: e.Severity,
		Code:                e.Code,
		Message:             e.Message,
		Detail:              e.Detail,
		Hint:                e.Hint,
	}
}

// encode appends the ErrorResponse frame to dst.
func (e *PGError) encode(dst []byte) []byte {
	out, err := e.response().Encode(dst)
	if err != nil { // only on absurd field sizes; fall back to a bare message
		out, _ = (&pgproto3.ErrorResponse{Severity: e.Severity, Code: e.Code, Message: "error"}).Encode(dst)
	}
	return out
}

func fatal(code, msg string, cause error) *PGError {
	return &PGError{Severity: "FATAL", Code: code, Message: msg, Err: cause}
}

func pgerr(code, msg string, cause error) *PGError {
	return &PGError{Severity: "ERROR", Code: code, Message: msg, Err: cause}
}
