//go:build race

package pooler_test

// raceEnabled says the race detector is on: its runtime allocates about
// half an object (2 KiB) per request of TestRequestPathCost on its own.
const raceEnabled = true
