package model

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteText writes the result as a small aligned table, one column per
// transport, followed by notes that say what was counted.
func (r Result) WriteText(w io.Writer) error {
	in := r.Input
	var b strings.Builder
	fmt.Fprintf(&b, "Little's law: %d connection%s, %s per query (RTT %s + exec %s + pooler overhead %s)\n",
		in.Conns, plural(in.Conns), fmtDur(r.PerQuery), fmtDur(in.RTT), fmtDur(in.Exec), fmtDur(in.Overhead))
	fmt.Fprintf(&b, "pool ceiling: %s\n\n", r.poolLine())

	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	row := func(label string, cell func(t TransportResult) string) {
		fmt.Fprint(tw, label)
		for _, t := range r.Transports {
			fmt.Fprint(tw, "\t", cell(t))
		}
		fmt.Fprint(tw, "\t\n")
	}
	row("", func(t TransportResult) string { return string(t.Transport) })
	row("sessions", func(t TransportResult) string {
		if t.Transport == QUIC {
			return fmt.Sprintf("%d (%dx%d)", t.Sessions, in.Conns, in.Streams)
		}
		return strconv.Itoa(t.Sessions)
	})
	row("client ceiling q/s", func(t TransportResult) string { return FormatQPS(t.CeilingQPS) })
	row("effective ceiling q/s", func(t TransportResult) string {
		if t.PoolBound {
			return FormatQPS(t.EffectiveQPS) + " (pool)"
		}
		return FormatQPS(t.EffectiveQPS)
	})
	row("connect: round trips", func(t TransportResult) string { return hs(t.Connect) })
	row("new session: round trips", func(t TransportResult) string { return hs(t.Session) })
	row("file descriptors", func(t TransportResult) string { return strconv.Itoa(t.FDs) })
	row("socket buffers", func(t TransportResult) string { return FormatBytes(t.SocketBytes) })
	if in.TargetQPS > 0 {
		fmt.Fprintf(tw, "for %s q/s:\t\t\t\t\n", FormatQPS(in.TargetQPS))
		row("  sessions needed", func(t TransportResult) string { return strconv.Itoa(t.Need.Sessions) })
		row("  connections needed", func(t TransportResult) string {
			if t.Transport == QUIC {
				return fmt.Sprintf("%d x %d streams", t.Need.Conns, t.Need.StreamsPerConn)
			}
			return strconv.Itoa(t.Need.Conns)
		})
		row("  pool size needed", func(t TransportResult) string {
			switch {
			case t.Need.PoolSize == 0:
				return "unknown"
			case t.Need.PoolShort:
				return fmt.Sprintf("%d (> %d)", t.Need.PoolSize, in.PoolSize)
			}
			return strconv.Itoa(t.Need.PoolSize)
		})
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	startup, _ := StartupRoundTrips(in.Auth)
	fmt.Fprintf(&b, "\nceiling = sessions / (RTT + exec + overhead); a TCP connection carries one session, a QUIC connection one per stream.\n")
	fmt.Fprintf(&b, "pool ceiling = pool size / (exec + overhead); a run reaches at most the lower of the two (effective).\n")
	fmt.Fprintf(&b, "round trips: TCP 1 + PostgreSQL startup %d (%s); TCP+TLS adds the SSLRequest and TLS 1.3's one;\n", startup, in.Auth)
	fmt.Fprintf(&b, "  QUIC 1 (transport and TLS 1.3 together, no 0-RTT) + startup; a new stream on a live QUIC connection needs only the startup.\n")
	fmt.Fprintf(&b, "descriptors and buffers are the client's: one TCP socket per connection (%s receive + %s send);\n",
		FormatBytes(r.Sockets.TCPRecv), FormatBytes(r.Sockets.TCPSend))
	fmt.Fprintf(&b, "  one UDP socket shared by all QUIC connections (%s + %s); buffer limits from %s, not memory in use.\n",
		FormatBytes(r.Sockets.UDPRecv), FormatBytes(r.Sockets.UDPSend), r.Sockets.Source)
	_, err := io.WriteString(w, b.String())
	return err
}

func (r Result) poolLine() string {
	in := r.Input
	switch {
	case in.PoolSize == 0:
		return "not modelled (no pool size)"
	case r.PoolCeilingQPS == 0:
		return fmt.Sprintf("unknown: %d server connections, but exec + overhead is 0 (give --exec or --overhead)", in.PoolSize)
	}
	return fmt.Sprintf("%s q/s (%d server connections / %s exec + overhead)",
		FormatQPS(r.PoolCeilingQPS), in.PoolSize, fmtDur(in.Exec+in.Overhead))
}

func hs(h Handshake) string {
	return fmt.Sprintf("%d = %s", h.RoundTrips, fmtDur(h.Time))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// fmtDur prints a duration the way a reader writes it: 30ms, 150.5ms, 1.2s.
func fmtDur(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}

// FormatQPS prints a rate rounded to a whole query per second, with
// thousands separators: 333.33 prints as 333, 13245.8 as 13,246.
func FormatQPS(q float64) string {
	if math.IsInf(q, 0) || math.IsNaN(q) {
		return "unbounded"
	}
	s := strconv.FormatFloat(math.Round(q), 'f', 0, 64)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// FormatBytes prints a byte count in binary units: 147456 prints as
// "144 KiB", 14680064 as "14 MiB".
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), 0
	for v >= unit && i < 4 {
		v /= unit
		i++
	}
	suffix := []string{"B", "KiB", "MiB", "GiB", "TiB"}[i]
	if v >= 100 || v == math.Trunc(v) {
		return fmt.Sprintf("%.0f %s", v, suffix)
	}
	return fmt.Sprintf("%.1f %s", v, suffix)
}

// jsonResult is the --json form of a Result: durations in milliseconds,
// names in snake_case, an unknown pool ceiling as null.
type jsonResult struct {
	Input struct {
		Conns      int     `json:"conns"`
		Streams    int     `json:"streams"`
		RTTMs      float64 `json:"rtt_ms"`
		ExecMs     float64 `json:"exec_ms"`
		OverheadMs float64 `json:"overhead_ms"`
		PoolSize   int     `json:"pool_size"`
		TargetQPS  float64 `json:"target_qps,omitempty"`
		Auth       string  `json:"auth"`
	} `json:"input"`
	PerQueryMs     float64         `json:"per_query_ms"`
	PoolCeilingQPS *float64        `json:"pool_ceiling_qps"`
	Sockets        jsonSockets     `json:"sockets"`
	Transports     []jsonTransport `json:"transports"`
}

type jsonSockets struct {
	TCPRecvBytes int64  `json:"tcp_recv_bytes"`
	TCPSendBytes int64  `json:"tcp_send_bytes"`
	UDPRecvBytes int64  `json:"udp_recv_bytes"`
	UDPSendBytes int64  `json:"udp_send_bytes"`
	Source       string `json:"source"`
}

type jsonHandshake struct {
	RoundTrips int     `json:"round_trips"`
	Ms         float64 `json:"ms"`
}

type jsonTransport struct {
	Transport    Transport     `json:"transport"`
	Sessions     int           `json:"sessions"`
	CeilingQPS   float64       `json:"ceiling_qps"`
	EffectiveQPS float64       `json:"effective_qps"`
	PoolBound    bool          `json:"pool_bound"`
	Connect      jsonHandshake `json:"connect"`
	Session      jsonHandshake `json:"new_session"`
	FDs          int           `json:"fds"`
	SocketBytes  int64         `json:"socket_bytes"`
	Need         *jsonNeed     `json:"need,omitempty"`
}

type jsonNeed struct {
	Sessions       int  `json:"sessions"`
	Conns          int  `json:"conns"`
	StreamsPerConn int  `json:"streams_per_conn"`
	PoolSize       int  `json:"pool_size"`
	PoolShort      bool `json:"pool_short"`
}

func ms(d time.Duration) float64 {
	return float64(d) / float64(time.Millisecond)
}

// MarshalJSON encodes the result with durations in milliseconds and an
// unknown pool ceiling as null, the form `pgquic ceiling --json` prints.
func (r Result) MarshalJSON() ([]byte, error) {
	var j jsonResult
	in := r.Input
	j.Input.Conns, j.Input.Streams = in.Conns, in.Streams
	j.Input.RTTMs, j.Input.ExecMs, j.Input.OverheadMs = ms(in.RTT), ms(in.Exec), ms(in.Overhead)
	j.Input.PoolSize, j.Input.TargetQPS, j.Input.Auth = in.PoolSize, in.TargetQPS, in.Auth
	j.PerQueryMs = ms(r.PerQuery)
	if r.PoolCeilingQPS > 0 {
		p := r.PoolCeilingQPS
		j.PoolCeilingQPS = &p
	}
	j.Sockets = jsonSockets{r.Sockets.TCPRecv, r.Sockets.TCPSend, r.Sockets.UDPRecv, r.Sockets.UDPSend, r.Sockets.Source}
	j.Transports = []jsonTransport{}
	for _, t := range r.Transports {
		jt := jsonTransport{
			Transport: t.Transport, Sessions: t.Sessions, CeilingQPS: t.CeilingQPS,
			EffectiveQPS: t.EffectiveQPS, PoolBound: t.PoolBound,
			Connect: jsonHandshake{t.Connect.RoundTrips, ms(t.Connect.Time)},
			Session: jsonHandshake{t.Session.RoundTrips, ms(t.Session.Time)},
			FDs:     t.FDs, SocketBytes: t.SocketBytes,
		}
		if n := t.Need; n != nil {
			jt.Need = &jsonNeed{n.Sessions, n.Conns, n.StreamsPerConn, n.PoolSize, n.PoolShort}
		}
		j.Transports = append(j.Transports, jt)
	}
	return json.Marshal(j)
}
