//go:build race

package benchtool

// raceEnabled says the test binary has the race detector, so the pgquic it
// builds has it too and reuses the same compiled packages.
const raceEnabled = true
