//go:build !race

package quicfront

// raceDetector says the race detector is on (see race_internal_on_test.go).
const raceDetector = false
