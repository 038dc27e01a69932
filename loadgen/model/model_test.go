package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/quicfront"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testSockets are fixed sizes, so results do not depend on the machine.
var testSockets = SocketSizes{TCPRecv: 131072, TCPSend: 16384, UDPRecv: 4 << 20, UDPSend: 4 << 20, Source: "test"}

func near(a, b float64) bool {
	return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b))
}

func TestCeiling(t *testing.T) {
	tests := []struct {
		name     string
		sessions int
		perQuery time.Duration
		want     float64
	}{
		{"issue example: 10 conns across 30ms", 10, 30 * time.Millisecond, 333.3333333},
		{"default TCP side: 500 conns across 150ms", 500, 150 * time.Millisecond, 3333.3333333},
		{"default QUIC side: 50x40 across 150ms", 2000, 150 * time.Millisecond, 13333.3333333},
		{"one session, 1ms", 1, time.Millisecond, 1000},
		{"exec and overhead add to the wait", 10, 30*time.Millisecond + 400*time.Microsecond + 100*time.Microsecond, 10 / 0.0305},
		{"no time: undefined", 10, 0, 0},
		{"negative time: undefined", 10, -time.Millisecond, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Ceiling(tt.sessions, tt.perQuery); !near(got, tt.want) {
				t.Errorf("Ceiling(%d, %v) = %v, want %v", tt.sessions, tt.perQuery, got, tt.want)
			}
		})
	}
}

func TestPoolCeiling(t *testing.T) {
	tests := []struct {
		pool           int
		exec, overhead time.Duration
		want           float64
	}{
		{20, 400 * time.Microsecond, 100 * time.Microsecond, 40000},
		{20, time.Millisecond, 0, 20000},
		{1, 0, 2 * time.Millisecond, 500},
		{20, 0, 0, 0}, // unknown
		{0, time.Millisecond, 0, 0},
	}
	for _, tt := range tests {
		if got := PoolCeiling(tt.pool, tt.exec, tt.overhead); !near(got, tt.want) {
			t.Errorf("PoolCeiling(%d, %v, %v) = %v, want %v", tt.pool, tt.exec, tt.overhead, got, tt.want)
		}
	}
}

func TestSessionsFor(t *testing.T) {
	tests := []struct {
		qps      float64
		perQuery time.Duration
		want     int
	}{
		{500, 20 * time.Millisecond, 10}, // exact: no spurious 11th
		{333, 30 * time.Millisecond, 10},
		{334, 30 * time.Millisecond, 11},
		{5000, 150500 * time.Microsecond, 753}, // 752.5 rounds up
		{1, time.Hour, 3600},
		{0.5, time.Millisecond, 1},
		{0, time.Second, 0},
		{100, 0, 0},
	}
	for _, tt := range tests {
		if got := SessionsFor(tt.qps, tt.perQuery); got != tt.want {
			t.Errorf("SessionsFor(%v, %v) = %d, want %d", tt.qps, tt.perQuery, got, tt.want)
		}
	}
}

func TestStartupRoundTrips(t *testing.T) {
	for auth, want := range map[string]int{"": 1, AuthTrust: 1, AuthPassword: 2, AuthMD5: 2, AuthSCRAM: 3} {
		if got, err := StartupRoundTrips(auth); err != nil || got != want {
			t.Errorf("StartupRoundTrips(%q) = %d, %v; want %d", auth, got, err, want)
		}
	}
	if _, err := StartupRoundTrips("cert"); !errors.Is(err, ErrInput) {
		t.Errorf("StartupRoundTrips(cert) = %v, want ErrInput", err)
	}
}

// TestCompute checks, transport by transport, every figure the model
// prints for a few inputs.
func TestCompute(t *testing.T) {
	type row struct {
		sessions          int
		ceiling, eff      float64
		poolBound         bool
		connectRT, sessRT int
		fds               int
		socketBytes       int64
	}
	const tcpSock = 131072 + 16384
	const udpSock = 8 << 20
	tests := []struct {
		name     string
		in       Input
		pool     float64
		perQuery time.Duration
		want     map[Transport]row
	}{{
		name:     "issue example",
		in:       Input{Conns: 10, RTT: 30 * time.Millisecond, PoolSize: 20},
		perQuery: 30 * time.Millisecond,
		want: map[Transport]row{
			TCP:    {10, 1000.0 / 3, 1000.0 / 3, false, 2, 2, 10, 10 * tcpSock},
			TCPTLS: {10, 1000.0 / 3, 1000.0 / 3, false, 4, 4, 10, 10 * tcpSock},
			QUIC:   {10, 1000.0 / 3, 1000.0 / 3, false, 2, 1, 1, udpSock},
		},
	}, {
		name: "default ramp scenario, QUIC with 40 streams",
		in: Input{Conns: 50, Streams: 40, RTT: 150 * time.Millisecond, Exec: 400 * time.Microsecond,
			Overhead: 100 * time.Microsecond, PoolSize: 20},
		pool:     40000,
		perQuery: 150500 * time.Microsecond,
		want: map[Transport]row{
			TCP:    {50, 50 / 0.1505, 50 / 0.1505, false, 2, 2, 50, 50 * tcpSock},
			TCPTLS: {50, 50 / 0.1505, 50 / 0.1505, false, 4, 4, 50, 50 * tcpSock},
			QUIC:   {2000, 2000 / 0.1505, 2000 / 0.1505, false, 2, 1, 1, udpSock},
		},
	}, {
		name: "pool-bound: a slow query and a small pool",
		in: Input{Conns: 100, Streams: 100, RTT: 10 * time.Millisecond, Exec: 5 * time.Millisecond,
			PoolSize: 4, Auth: AuthSCRAM},
		pool:     800,
		perQuery: 15 * time.Millisecond,
		want: map[Transport]row{
			TCP:    {100, 100 / 0.015, 800, true, 4, 4, 100, 100 * tcpSock},
			TCPTLS: {100, 100 / 0.015, 800, true, 6, 6, 100, 100 * tcpSock},
			QUIC:   {10000, 10000 / 0.015, 800, true, 4, 3, 1, udpSock},
		},
	}, {
		name:     "no pool size: no pool ceiling",
		in:       Input{Conns: 1, RTT: time.Millisecond, Exec: time.Millisecond},
		perQuery: 2 * time.Millisecond,
		want: map[Transport]row{
			TCP:    {1, 500, 500, false, 2, 2, 1, tcpSock},
			TCPTLS: {1, 500, 500, false, 4, 4, 1, tcpSock},
			QUIC:   {1, 500, 500, false, 2, 1, 1, udpSock},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Compute(tt.in, testSockets)
			if err != nil {
				t.Fatal(err)
			}
			if res.PerQuery != tt.perQuery {
				t.Errorf("PerQuery = %v, want %v", res.PerQuery, tt.perQuery)
			}
			if !near(res.PoolCeilingQPS, tt.pool) {
				t.Errorf("PoolCeilingQPS = %v, want %v", res.PoolCeilingQPS, tt.pool)
			}
			if len(res.Transports) != len(Transports) {
				t.Fatalf("%d transports, want %d", len(res.Transports), len(Transports))
			}
			for i, got := range res.Transports {
				if got.Transport != Transports[i] {
					t.Errorf("transport %d is %s, want %s", i, got.Transport, Transports[i])
				}
				w := tt.want[got.Transport]
				if got.Sessions != w.sessions || !near(got.CeilingQPS, w.ceiling) || !near(got.EffectiveQPS, w.eff) ||
					got.PoolBound != w.poolBound || got.Connect.RoundTrips != w.connectRT ||
					got.Session.RoundTrips != w.sessRT || got.FDs != w.fds || got.SocketBytes != w.socketBytes {
					t.Errorf("%s: got %+v\nwant %+v", got.Transport, got, w)
				}
				if got.Connect.Time != time.Duration(w.connectRT)*tt.in.RTT || got.Session.Time != time.Duration(w.sessRT)*tt.in.RTT {
					t.Errorf("%s: handshake times %v/%v do not match round trips x RTT", got.Transport, got.Connect.Time, got.Session.Time)
				}
				if got.Need != nil {
					t.Errorf("%s: Need without a target: %+v", got.Transport, got.Need)
				}
			}
		})
	}
}

func TestComputeTarget(t *testing.T) {
	tests := []struct {
		name string
		in   Input
		want map[Transport]Need
	}{{
		name: "1000 q/s across 30ms",
		in:   Input{Conns: 10, RTT: 30 * time.Millisecond, TargetQPS: 1000, PoolSize: 20},
		want: map[Transport]Need{
			TCP:    {Sessions: 30, Conns: 30, StreamsPerConn: 1},
			TCPTLS: {Sessions: 30, Conns: 30, StreamsPerConn: 1},
			QUIC:   {Sessions: 30, Conns: 10, StreamsPerConn: 3},
		},
	}, {
		name: "5000 q/s across the default scenario",
		in: Input{Conns: 50, Streams: 40, RTT: 150 * time.Millisecond, Exec: 400 * time.Microsecond,
			Overhead: 100 * time.Microsecond, TargetQPS: 5000, PoolSize: 20},
		want: map[Transport]Need{
			TCP:    {Sessions: 753, Conns: 753, StreamsPerConn: 1, PoolSize: 3},
			TCPTLS: {Sessions: 753, Conns: 753, StreamsPerConn: 1, PoolSize: 3},
			QUIC:   {Sessions: 753, Conns: 50, StreamsPerConn: 16, PoolSize: 3},
		},
	}, {
		name: "more streams than the server allows per connection",
		in:   Input{Conns: 2, RTT: 100 * time.Millisecond, Exec: 2 * time.Millisecond, TargetQPS: 25000, PoolSize: 20},
		want: map[Transport]Need{
			TCP:    {Sessions: 2550, Conns: 2550, StreamsPerConn: 1, PoolSize: 50, PoolShort: true},
			TCPTLS: {Sessions: 2550, Conns: 2550, StreamsPerConn: 1, PoolSize: 50, PoolShort: true},
			QUIC:   {Sessions: 2550, Conns: 3, StreamsPerConn: ServerStreamLimit, PoolSize: 50, PoolShort: true},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Compute(tt.in, testSockets)
			if err != nil {
				t.Fatal(err)
			}
			for _, tr := range res.Transports {
				if tr.Need == nil {
					t.Fatalf("%s: no Need", tr.Transport)
				}
				if *tr.Need != tt.want[tr.Transport] {
					t.Errorf("%s: Need %+v, want %+v", tr.Transport, *tr.Need, tt.want[tr.Transport])
				}
				// What the model says is needed must reach the target.
				n := tr.Need
				sessions := n.Conns * n.StreamsPerConn
				if got := Ceiling(sessions, res.PerQuery); got < tt.in.TargetQPS {
					t.Errorf("%s: %d sessions give %v q/s, short of %v", tr.Transport, sessions, got, tt.in.TargetQPS)
				}
			}
		})
	}
}

func TestInputValidate(t *testing.T) {
	ok := Input{Conns: 1, RTT: time.Millisecond}
	tests := []struct {
		name string
		edit func(*Input)
		want string
	}{
		{"no connections", func(in *Input) { in.Conns = 0 }, "connections must be at least 1"},
		{"negative streams", func(in *Input) { in.Streams = -1 }, "streams per connection"},
		{"zero RTT", func(in *Input) { in.RTT = 0 }, "round-trip time must be positive"},
		{"negative RTT", func(in *Input) { in.RTT = -time.Millisecond }, "round-trip time must be positive"},
		{"negative exec", func(in *Input) { in.Exec = -1 }, "execution time"},
		{"negative overhead", func(in *Input) { in.Overhead = -1 }, "pooler overhead"},
		{"negative pool", func(in *Input) { in.PoolSize = -1 }, "pool size"},
		{"negative target", func(in *Input) { in.TargetQPS = -1 }, "target rate"},
		{"NaN target", func(in *Input) { in.TargetQPS = math.NaN() }, "target rate"},
		{"unknown auth", func(in *Input) { in.Auth = "gss" }, `auth method "gss"`},
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid input refused: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := ok
			tt.edit(&in)
			err := in.Validate()
			if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate = %v, want ErrInput containing %q", err, tt.want)
			}
			if _, err := Compute(in, testSockets); !errors.Is(err, ErrInput) {
				t.Errorf("Compute accepted invalid input: %v", err)
			}
		})
	}
}

func TestReadSocketSizes(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, s string) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Nothing readable: Linux's documented defaults.
	s := ReadSocketSizes(filepath.Join(dir, "missing"), false)
	want := SocketSizes{TCPRecv: 131072, TCPSend: 16384, UDPRecv: 212992, UDPSend: 212992, Source: "Linux defaults"}
	if s != want {
		t.Errorf("defaults: %+v, want %+v", s, want)
	}

	write("net/ipv4/tcp_rmem", "4096\t87380\t6291456\n")
	write("net/ipv4/tcp_wmem", "4096\t65536\t4194304\n")
	write("net/core/rmem_max", "4194304\n")
	write("net/core/wmem_max", "garbage\n")
	s = ReadSocketSizes(dir, false)
	want = SocketSizes{TCPRecv: 87380, TCPSend: 65536, UDPRecv: 4194304, UDPSend: 212992,
		Source: dir + "; Linux defaults for net/core/wmem_max"}
	if s != want {
		t.Errorf("partial: %+v, want %+v", s, want)
	}

	// A privileged process forces quic-go's full 7 MiB past the caps.
	write("net/core/wmem_max", "4194304\n")
	s = ReadSocketSizes(dir, true)
	want = SocketSizes{TCPRecv: 87380, TCPSend: 65536, UDPRecv: QUICSocketBuffer, UDPSend: QUICSocketBuffer, Source: dir}
	if s != want {
		t.Errorf("privileged: %+v, want %+v", s, want)
	}
}

// TestServerStreamLimit keeps the model's stream limit equal to the
// server's default, without making the model import the QUIC front.
func TestServerStreamLimit(t *testing.T) {
	if ServerStreamLimit != quicfront.DefaultMaxStreamsPerConn {
		t.Errorf("ServerStreamLimit = %d, quicfront.DefaultMaxStreamsPerConn = %d", ServerStreamLimit, quicfront.DefaultMaxStreamsPerConn)
	}
}

func TestFormatQPS(t *testing.T) {
	for q, want := range map[float64]string{
		1000.0 / 3: "333", 333.5: "334", 0: "0", 999.4: "999", 13245.8: "13,246",
		1234567: "1,234,567", -1500: "-1,500", math.Inf(1): "unbounded",
	} {
		if got := FormatQPS(q); got != want {
			t.Errorf("FormatQPS(%v) = %q, want %q", q, got, want)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 1023: "1023 B", 1024: "1 KiB", 147456: "144 KiB", 1536: "1.5 KiB",
		14 << 20: "14 MiB", 70 * 147456: "9.8 MiB", 3 << 30: "3 GiB",
	} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestWriteText(t *testing.T) {
	res, err := Compute(Input{Conns: 10, RTT: 30 * time.Millisecond, TargetQPS: 1000, PoolSize: 20}, testSockets)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := res.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	lines := map[string][]string{} // label -> cells
	for _, l := range strings.Split(out, "\n") {
		f := strings.Split(strings.TrimSpace(l), "  ")
		var cells []string
		for _, c := range f {
			if c = strings.TrimSpace(c); c != "" {
				cells = append(cells, c)
			}
		}
		if len(cells) > 1 {
			lines[cells[0]] = cells[1:]
		}
	}
	check := func(label string, want ...string) {
		t.Helper()
		if got := lines[label]; strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("row %q = %q, want %q\n%s", label, got, want, out)
		}
	}
	check("client ceiling q/s", "333", "333", "333")
	check("effective ceiling q/s", "333", "333", "333")
	check("connect: round trips", "2 = 60ms", "4 = 120ms", "2 = 60ms")
	check("new session: round trips", "2 = 60ms", "4 = 120ms", "1 = 30ms")
	check("file descriptors", "10", "10", "1")
	check("socket buffers", "1.4 MiB", "1.4 MiB", "8 MiB")
	check("connections needed", "30", "30", "10 x 3 streams")
	for _, s := range []string{"pool ceiling: unknown", "give --exec or --overhead", "for 1,000 q/s", "buffer limits from test"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
}

func TestMarshalJSON(t *testing.T) {
	res, err := Compute(Input{Conns: 50, Streams: 40, RTT: 150 * time.Millisecond, Exec: 400 * time.Microsecond,
		Overhead: 100 * time.Microsecond, PoolSize: 20, TargetQPS: 5000}, testSockets)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Input struct {
			RTTMs  float64 `json:"rtt_ms"`
			ExecMs float64 `json:"exec_ms"`
		} `json:"input"`
		PerQueryMs     float64  `json:"per_query_ms"`
		PoolCeilingQPS *float64 `json:"pool_ceiling_qps"`
		Transports     []struct {
			Transport  string  `json:"transport"`
			Sessions   int     `json:"sessions"`
			CeilingQPS float64 `json:"ceiling_qps"`
			Connect    struct {
				RoundTrips int     `json:"round_trips"`
				Ms         float64 `json:"ms"`
			} `json:"connect"`
			Need *struct {
				StreamsPerConn int `json:"streams_per_conn"`
			} `json:"need"`
		} `json:"transports"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Input.RTTMs != 150 || got.Input.ExecMs != 0.4 || got.PerQueryMs != 150.5 {
		t.Errorf("durations not in ms: %s", b)
	}
	if got.PoolCeilingQPS == nil || !near(*got.PoolCeilingQPS, 40000) {
		t.Errorf("pool_ceiling_qps: %s", b)
	}
	if len(got.Transports) != 3 || got.Transports[2].Transport != "quic" || got.Transports[2].Sessions != 2000 ||
		got.Transports[1].Connect.RoundTrips != 4 || got.Transports[1].Connect.Ms != 600 ||
		got.Transports[2].Need == nil || got.Transports[2].Need.StreamsPerConn != 16 {
		t.Errorf("transports: %s", b)
	}

	// An unknown pool ceiling is null, not 0.
	res, _ = Compute(Input{Conns: 1, RTT: time.Millisecond, PoolSize: 20}, testSockets)
	b, _ = json.Marshal(res)
	if !bytes.Contains(b, []byte(`"pool_ceiling_qps":null`)) {
		t.Errorf("unknown pool ceiling: %s", b)
	}
}
