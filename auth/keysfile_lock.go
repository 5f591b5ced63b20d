package auth

import (
	"context"
	"fmt"
	"os"
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
// for the lock until ctx ends; waiters are served in the order the kernel queues them.
func LockKeysFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("auth: keys file lock: %w", err)
	}
	// The wait blocks a thread in the kernel and cannot be interrupted: it runs on its own
	// goroutine, and if ctx ends first, whoever is waiting gives the lock back as soon as it
	// gets it.
	type result struct{ err error }
	got := make(chan result) // unbuffered: a lock is handed over only to a caller still waiting
	abandon := make(chan struct{})
	go func() {
		err := lockFile(f)
		select {
		case got <- result{err}:
		case <-abandon:
			if err == nil {
				unlockFile(f)
			}
			f.Close()
		}
	}()
	select {
	case r := <-got:
		if r.err != nil {
			f.Close()
			return nil, fmt.Errorf("auth: keys file lock %s: %w", f.Name(), r.err)
		}
		return func() { unlockFile(f); f.Close() }, nil
	case <-ctx.Done():
		close(abandon)
		return nil, fmt.Errorf("auth: keys file lock %s: another writer holds it: %w", f.Name(), context.Cause(ctx))
	}
}
