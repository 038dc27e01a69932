//go:build race

package quicfront

// raceDetector says the race detector is on: it allocates for its own
// bookkeeping and changes scheduling, so the path-cost gate checks only
// packets under it.
const raceDetector = true
