//go:build race

package wan

// raceEnabled: the race detector slows the relay several times over.
const raceEnabled = true
