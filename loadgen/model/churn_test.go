package model

import (
	"errors"
	"testing"
	"time"
)

func TestChurnRoundTrips(t *testing.T) {
	tests := []struct {
		tr            Transport
		auth          string
		rtts, connect int
	}{
		{TCP, AuthTrust, 3, 2},
		{TCPTLS, AuthTrust, 5, 4},
		{TCPTLS, AuthSCRAM, 7, 6},
		{QUIC, AuthTrust, 3, 2},
		{EdgeLocal, AuthTrust, 1, 0},
		{EdgeLocal, AuthSCRAM, 1, 0}, // the pooler trusts the edge's certificate
	}
	for _, tt := range tests {
		n, err := ChurnRoundTrips(tt.tr, tt.auth)
		c, cerr := ChurnConnectRoundTrips(tt.tr, tt.auth)
		if err != nil || cerr != nil || n != tt.rtts || c != tt.connect {
			t.Errorf("%s/%s: %d round trips (%d to connect), %v %v; want %d (%d)", tt.tr, tt.auth, n, c, err, cerr, tt.rtts, tt.connect)
		}
	}
	if _, err := ChurnRoundTrips("udp", AuthTrust); !errors.Is(err, ErrInput) {
		t.Errorf("unknown path: %v", err)
	}
	// A session-per-query ceiling is Little's law over k round trips: 100
	// sessions over TCP+TLS at 150 ms, 5 x 150 + 1 ms each.
	per := ChurnPerQuery(5, 150*time.Millisecond, time.Millisecond, 0)
	if per != 751*time.Millisecond {
		t.Errorf("per query %v", per)
	}
	if c := Ceiling(100, per); c < 133 || c > 134 {
		t.Errorf("ceiling %.1f", c)
	}
	if p := PortCeiling(28232); p < 470 || p > 471 || PortCeiling(0) != 0 {
		t.Errorf("port ceiling %.1f", p)
	}
}
