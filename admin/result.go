package admin

import (
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// PostgreSQL type OIDs of the columns PgBouncer's console sends
// (pktbuf_write_RowDescription in PgBouncer's src/pktbuf.c): text for
// strings and timestamps, int4, int8 and numeric.
const (
	oidText    = 25
	oidInt4    = 23
	oidInt8    = 20
	oidNumeric = 1700
)

// colType is one of PgBouncer's column type letters: 's' text, 'i' int4,
// 'q' int8, 'N' numeric, 'T' a timestamp sent as text.
type colType byte

// column is a result column: its name and type.
type column struct {
	name string
	typ  colType
}

// cols builds columns from a PgBouncer-style type string and the names,
// so each result reads like its PgBouncer counterpart.
func cols(types string, names ...string) []column {
	if len(types) != len(names) {
		panic("admin: column types and names differ in number")
	}
	out := make([]column, len(names))
	for i, n := range names {
		out[i] = column{name: n, typ: colType(types[i])}
	}
	return out
}

// result is one result set being built.
type result struct {
	cols []column
	rows [][][]byte
}

// null is a NULL cell.
var null []byte

// add appends a row; each value is a string, an integer, a time (sent in
// PgBouncer's "2006-01-02 15:04:05 UTC" form, NULL when zero), []byte(nil)
// for NULL, or a bool (1 or 0, as PgBouncer's int flags).
func (r *result) add(vals ...any) {
	if len(vals) != len(r.cols) {
		panic("admin: row width differs from the columns")
	}
	row := make([][]byte, len(vals))
	for i, v := range vals {
		switch v := v.(type) {
		case string:
			row[i] = []byte(v)
		case int:
			row[i] = strconv.AppendInt(nil, int64(v), 10)
		case int64:
			row[i] = strconv.AppendInt(nil, v, 10)
		case uint32:
			row[i] = strconv.AppendUint(nil, uint64(v), 10)
		case uint64:
			row[i] = strconv.AppendUint(nil, v, 10)
		case bool:
			if v {
				row[i] = []byte("1")
			} else {
				row[i] = []byte("0")
			}
		case time.Time:
			if !v.IsZero() {
				row[i] = []byte(v.UTC().Format("2006-01-02 15:04:05 UTC"))
			}
		case []byte:
			row[i] = v
		default:
			panic("admin: unsupported cell type")
		}
	}
	r.rows = append(r.rows, row)
}

// encode appends RowDescription, the DataRows and CommandComplete with tag.
func (r *result) encode(dst []byte, tag string) []byte {
	rd := &pgproto3.RowDescription{Fields: make([]pgproto3.FieldDescription, len(r.cols))}
	for i, c := range r.cols {
		f := pgproto3.FieldDescription{Name: []byte(c.name), TypeModifier: -1}
		switch c.typ {
		case 'i':
			f.DataTypeOID, f.DataTypeSize = oidInt4, 4
		case 'q':
			f.DataTypeOID, f.DataTypeSize = oidInt8, 8
		case 'N':
			f.DataTypeOID, f.DataTypeSize = oidNumeric, -1
		default:
			f.DataTypeOID, f.DataTypeSize = oidText, -1
		}
		rd.Fields[i] = f
	}
	dst, _ = rd.Encode(dst)
	for _, row := range r.rows {
		dst, _ = (&pgproto3.DataRow{Values: row}).Encode(dst)
	}
	dst, _ = (&pgproto3.CommandComplete{CommandTag: []byte(tag)}).Encode(dst)
	return dst
}
