//go:build !unix

package auth

import (
	"errors"
	"os"
)

// Without flock the keys file cannot be shared safely between writers: refuse to write it
// rather than lose changes.
func lockFile(*os.File) error { return errors.New("file locks are not supported on this system") }

func unlockFile(*os.File) {}
