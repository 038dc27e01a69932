//go:build !race

package wan

const raceEnabled = false
