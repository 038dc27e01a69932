package backend

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"
)

// Template databases. PostgreSQL refuses CREATE DATABASE ... TEMPLATE t
// while any other session is connected to t ("source database is being
// accessed by other users"), so an idle server connection a pool keeps to
// template1 (or any database with datistemplate) would break every
// CREATE DATABASE for as long as the pool keeps it. A pool whose database
// is a template therefore keeps none: fillMin opens none (MinPool counts as
// 0), a connection released idle is closed instead of pooled (Release),
// and sweepIdle closes any left idle, such as those warm opened before the
// first connection found out. Connections lent out are unaffected: a
// client inside a transaction on template1 blocks CREATE DATABASE as it
// would connected directly.

// templateQuery asks whether the connection's database is a template.
const templateQuery = "SELECT datistemplate FROM pg_database WHERE datname = current_database()"

// readTemplate runs templateQuery on a new connection, before the pooler
// takes it over, and records the answer: once per pool, since whether a
// database is a template does not change while anyone is connected to it
// (ALTER DATABASE ... IS_TEMPLATE aside, which a reload's new pools read
// again). A server that cannot answer (not PostgreSQL, or no pg_database
// access) is taken as no template, and asked again by the next connection.
func (p *Pool) readTemplate(ctx context.Context, c *pgconn.PgConn) {
	res := c.ExecParams(ctx, templateQuery, nil, nil, nil, nil).Read()
	if res.Err != nil {
		p.logger.Debug("backend: cannot tell whether the database is a template", "err", res.Err)
		return
	}
	isTemplate := len(res.Rows) == 1 && len(res.Rows[0]) == 1 && string(res.Rows[0][0]) == "t"
	p.template.Store(isTemplate)
	if p.templateKnown.Swap(true) {
		return // another connection of the pool answered first
	}
	if isTemplate {
		p.logger.Info("backend: the database is a template: its pool keeps no idle server connection, so CREATE DATABASE ... TEMPLATE works")
	}
}

// Template reports whether the pool's database is a template database, as
// its first connection found (false until one has connected).
func (p *Pool) Template() bool { return p.template.Load() }
