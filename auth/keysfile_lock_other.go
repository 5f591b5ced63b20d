//go:build !unix

package auth

import (
	"errors"
	"os"
)

var errLockUnsupported = errors.New("file locks are not supported on this system")

// Without flock the keys file cannot be shared safely between writers: refuse to write it
// rather than lose changes.
func tryLock(*os.File) (bool, error) { return false, errLockUnsupported }

func unlockFile(*os.File) {}
