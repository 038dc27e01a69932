package wan

import "sync"

// maxRead is the most the relay reads at once: the largest UDP datagram, and
// the TCP read size.
const maxRead = 64 << 10

// bufClasses are the capacities of the pooled buffers that hold data while
// it waits: a QUIC packet fits the smallest (quic-go sends at most 1452-byte
// datagrams unless path MTU discovery finds more), a TCP read the others.
var bufClasses = [...]int{2 << 10, 16 << 10, maxRead}

var bufPools [len(bufClasses)]sync.Pool

// getBuf returns a pooled buffer of length n (n <= maxRead). The pointer
// keeps sync.Pool from allocating on Put.
func getBuf(n int) *[]byte {
	for i, size := range bufClasses {
		if n <= size {
			if b, ok := bufPools[i].Get().(*[]byte); ok {
				*b = (*b)[:n]
				return b
			}
			b := make([]byte, n, size)
			return &b
		}
	}
	b := make([]byte, n)
	return &b
}

// putBuf gives a buffer from getBuf back to its pool.
func putBuf(b *[]byte) {
	for i, size := range bufClasses {
		if cap(*b) == size {
			bufPools[i].Put(b)
			return
		}
	}
}

// datagram is one UDP datagram waiting for its delivery time.
type datagram struct {
	at   int64 // delivery time, nanoseconds since the relay's epoch
	seq  uint64
	buf  *[]byte
	down bool // upstream to client
}

// before orders datagrams by delivery time, then by arrival, so equal delays
// keep arrival order.
func (d *datagram) before(o *datagram) bool {
	return d.at < o.at || d.at == o.at && d.seq < o.seq
}

// datagramHeap is a min-heap on delivery time. It is typed rather than built
// on container/heap so that pushing does not box each datagram.
type datagramHeap []datagram

func (h *datagramHeap) push(d datagram) {
	*h = append(*h, d)
	s := *h
	i := len(s) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if !s[i].before(&s[parent]) {
			break
		}
		s[i], s[parent] = s[parent], s[i]
		i = parent
	}
}

// pop removes and returns the earliest datagram; h must not be empty.
func (h *datagramHeap) pop() datagram {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s[last] = datagram{}
	s = s[:last]
	i := 0
	for {
		l, r, least := 2*i+1, 2*i+2, i
		if l < len(s) && s[l].before(&s[least]) {
			least = l
		}
		if r < len(s) && s[r].before(&s[least]) {
			least = r
		}
		if least == i {
			break
		}
		s[i], s[least] = s[least], s[i]
		i = least
	}
	*h = s
	return top
}
