package driversuite

import "strings"

// CINodePostgresFiles is the node-postgres subset CI runs (files under
// packages/pg/test/integration): every file that passed directly and
// through pgquic in session mode in the full runs of 2026-12-01, except
// connection/dynamic-password-tests.js (needs a server that asks for a
// password) and the two files whose 5-second limits fail on a loaded machine
// even directly (gh-issues/1105-tests.js, connection-pool/error-tests.js).
// They must keep passing through session mode.
var CINodePostgresFiles = []string{
	"client/api-tests.js",
	"client/appname-tests.js",
	"client/array-tests.js",
	"client/big-simple-query-tests.js",
	"client/configuration-tests.js",
	"client/connection-parameter-tests.js",
	"client/connection-timeout-tests.js",
	"client/custom-types-tests.js",
	"client/empty-query-tests.js",
	"client/error-handling-tests.js",
	"client/field-name-escape-tests.js",
	"client/huge-numeric-tests.js",
	"client/idle_in_transaction_session_timeout-tests.js",
	"client/json-type-parsing-tests.js",
	"client/multiple-results-tests.js",
	"client/network-partition-tests.js",
	"client/no-data-tests.js",
	"client/no-row-result-tests.js",
	"client/notice-tests.js",
	"client/parse-int-8-tests.js",
	"client/prepared-statement-tests.js",
	"client/promise-api-tests.js",
	"client/query-as-promise-tests.js",
	"client/query-column-names-tests.js",
	"client/query-error-handling-prepared-statement-tests.js",
	"client/query-error-handling-tests.js",
	"client/quick-disconnect-tests.js",
	"client/result-metadata-tests.js",
	"client/results-as-array-tests.js",
	"client/row-description-on-results-tests.js",
	"client/sasl-scram-tests.js",
	"client/simple-query-tests.js",
	"client/ssl-tests.js",
	"client/statement_timeout-tests.js",
	"client/timezone-tests.js",
	"client/transaction-tests.js",
	"client/type-coercion-tests.js",
	"client/type-parser-override-tests.js",
	"connection-pool/connection-pool-size-tests.js",
	"connection-pool/idle-timeout-tests.js",
	"connection-pool/native-instance-tests.js",
	"connection-pool/tls-tests.js",
	"connection-pool/yield-support-tests.js",
	"connection/bound-command-tests.js",
	"connection/copy-tests.js",
	"connection/notification-tests.js",
	"connection/query-tests.js",
	"domain-tests.js",
	"gh-issues/130-tests.js",
	"gh-issues/131-tests.js",
	"gh-issues/1382-tests.js",
	"gh-issues/1542-tests.js",
	"gh-issues/1854-tests.js",
	"gh-issues/199-tests.js",
	"gh-issues/1992-tests.js",
	"gh-issues/2056-tests.js",
	"gh-issues/2064-tests.js",
	"gh-issues/2079-tests.js",
	"gh-issues/2085-tests.js",
	"gh-issues/2108-tests.js",
	"gh-issues/2303-tests.js",
	"gh-issues/2307-tests.js",
	"gh-issues/2416-tests.js",
	"gh-issues/2556-tests.js",
	"gh-issues/507-tests.js",
	"gh-issues/600-tests.js",
	"gh-issues/675-tests.js",
	"gh-issues/699-tests.js",
	"gh-issues/787-tests.js",
	"gh-issues/882-tests.js",
	"gh-issues/981-tests.js",
}

// CINodePostgresTransactionFiles are the files of CINodePostgresFiles that
// also passed through transaction mode in both full runs: CI checks they
// keep passing there. README.md lists the others with the reason.
var CINodePostgresTransactionFiles = []string{
	"client/api-tests.js",
	"client/appname-tests.js",
	"client/array-tests.js",
	"client/big-simple-query-tests.js",
	"client/configuration-tests.js",
	"client/connection-parameter-tests.js",
	"client/connection-timeout-tests.js",
	"client/custom-types-tests.js",
	"client/empty-query-tests.js",
	"client/field-name-escape-tests.js",
	"client/huge-numeric-tests.js",
	"client/idle_in_transaction_session_timeout-tests.js",
	"client/json-type-parsing-tests.js",
	"client/multiple-results-tests.js",
	"client/network-partition-tests.js",
	"client/no-row-result-tests.js",
	"client/parse-int-8-tests.js",
	"client/promise-api-tests.js",
	"client/query-as-promise-tests.js",
	"client/query-column-names-tests.js",
	"client/result-metadata-tests.js",
	"client/results-as-array-tests.js",
	"client/row-description-on-results-tests.js",
	"client/sasl-scram-tests.js",
	"client/ssl-tests.js",
	"client/statement_timeout-tests.js",
	"client/timezone-tests.js",
	"client/transaction-tests.js",
	"connection-pool/connection-pool-size-tests.js",
	"connection-pool/idle-timeout-tests.js",
	"connection-pool/native-instance-tests.js",
	"connection-pool/tls-tests.js",
	"connection-pool/yield-support-tests.js",
	"connection/bound-command-tests.js",
	"connection/copy-tests.js",
	"connection/notification-tests.js",
	"domain-tests.js",
	"gh-issues/131-tests.js",
	"gh-issues/1382-tests.js",
	"gh-issues/1542-tests.js",
	"gh-issues/1854-tests.js",
	"gh-issues/199-tests.js",
	"gh-issues/1992-tests.js",
	"gh-issues/2056-tests.js",
	"gh-issues/2064-tests.js",
	"gh-issues/2079-tests.js",
	"gh-issues/2085-tests.js",
	"gh-issues/2108-tests.js",
	"gh-issues/2303-tests.js",
	"gh-issues/2307-tests.js",
	"gh-issues/2416-tests.js",
	"gh-issues/2556-tests.js",
	"gh-issues/507-tests.js",
	"gh-issues/675-tests.js",
	"gh-issues/699-tests.js",
	"gh-issues/787-tests.js",
	"gh-issues/882-tests.js",
	"gh-issues/981-tests.js",
}

// CIPsycopgModules is the psycopg subset CI runs (pytest arguments):
// modules without the tests psycopg marks slow or flakey (flakey: they fail
// now and then even against a plain server, such as an error that may or
// may not arrive before the next command is sent), whose tests all passed
// directly and through pgquic in session mode, chosen to cover connections,
// cursors, COPY, pipelines, prepared statements, transactions and two-phase
// commit in a few minutes.
var CIPsycopgModules = append([]string{"-m", "not slow and not flakey"},
	"tests/test_connection.py",
	"tests/test_cursor.py",
	"tests/test_client_cursor.py",
	"tests/test_server_cursor.py",
	"tests/test_copy.py",
	"tests/test_pipeline.py",
	"tests/test_prepared.py",
	"tests/test_transaction.py",
	"tests/test_sql.py",
	"tests/test_errors.py",
	"tests/test_adapt.py",
	"tests/test_rows.py",
	"tests/test_query.py",
	"tests/test_tpc.py",
	"tests/pq/test_async.py",
	"tests/pq/test_exec.py",
	"tests/pq/test_copy.py",
)

// CIPsycopgTransactionModules are the modules of CIPsycopgModules whose
// tests all passed through transaction mode too.
var CIPsycopgTransactionModules = append([]string{"-m", "not slow"},
	"tests/test_cursor.py",
	"tests/test_client_cursor.py",
	"tests/test_server_cursor.py",
	"tests/test_copy.py",
	"tests/test_sql.py",
	"tests/test_errors.py",
	"tests/test_adapt.py",
	"tests/test_rows.py",
	"tests/test_query.py",
	"tests/test_tpc.py",
	"tests/pq/test_async.py",
	"tests/pq/test_exec.py",
	"tests/pq/test_copy.py",
)

// inSelection reports whether test id belongs to one of sel's files:
// node-postgres ids start with their file, psycopg ids with their module
// ("tests.test_x::..." or "tests.test_x.Class::..." for tests/test_x.py).
func inSelection(id string, sel []string) bool {
	for _, s := range sel {
		if strings.HasSuffix(s, ".py") {
			mod := strings.ReplaceAll(strings.TrimSuffix(s, ".py"), "/", ".")
			if strings.HasPrefix(id, mod+"::") || strings.HasPrefix(id, mod+".") {
				return true
			}
			continue
		}
		if id == s || strings.HasPrefix(id, s+" :: ") {
			return true
		}
	}
	return false
}
