//go:build !linux

package main

import "errors"

// enterRealtime is not available here: the ramp runs with the operating
// system's default scheduling.
func enterRealtime() error {
	return errors.New("real-time scheduling is implemented for Linux only")
}
