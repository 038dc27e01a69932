//go:build !unix

package quicclient

import "io/fs"

// checkCacheFile accepts any file where Unix permissions do not apply;
// protect the file with the platform's own access control.
func checkCacheFile(fs.FileInfo) error { return nil }
