//go:build !race

package benchtool

// raceEnabled says the test binary has the race detector; see race_test.go.
const raceEnabled = false
