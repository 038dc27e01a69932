//go:build race

package quicfront_test

// raceEnabled says the race detector is on: it slows QUIC handshakes and
// pgx about tenfold, so the largest tests scale down and the full-size runs
// are left to the test pass without it (scripts/test runs both).
const raceEnabled = true
