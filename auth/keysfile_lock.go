package auth

import (
	"context"
	"fmt"
	"os"
	"time"
)

// LockKeysFile takes the keys file's writer lock: an advisory lock on "<path>.lock", held by
// one process at a time, until the returned unlock is called (or the process dies). Every
// writer of the file (`gateway keys`, and a running gateway's POST/DELETE /keys) takes it
// around its read, change and atomic rewrite, so two writers never both start from the same
// file and one of their changes (a revocation) is lost. Readers need no lock: the file is
// replaced by rename, so they read the old file or the new one, whole.
//
// The lock file sits beside the keys file (its directory is writable: the rewrite needs it)
// and is never removed, so two writers can never lock two different files. LockKeysFile waits
// for the lock until ctx ends.
func LockKeysFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("auth: keys file lock: %w", err)
	}
	for delay := time.Millisecond; ; delay = min(2*delay, 20*time.Millisecond) {
		locked, err := tryLock(f)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("auth: keys file lock %s: %w", f.Name(), err)
		}
		if locked {
			return func() { unlockFile(f); f.Close() }, nil
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("auth: keys file lock %s: another writer holds it: %w", f.Name(), context.Cause(ctx))
		case <-time.After(delay):
		}
	}
}
