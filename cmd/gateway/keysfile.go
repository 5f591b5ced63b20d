package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
)

// fileKeys manages keys for a gateway whose registry is in memory, loaded from
// auth.keys_file: POST/DELETE /keys write the file (as `gateway keys` does) and then load it
// into the registry, so a change survives the next reload instead of being dropped by it.
type fileKeys struct {
	mu   sync.Mutex // one change of the file at a time
	path string
	mem  *auth.MemoryRegistry
}

func (f *fileKeys) Add(ctx context.Context, e auth.Entry) error {
	return f.change(ctx, func(s keyStore) error { return s.Add(ctx, e) })
}

func (f *fileKeys) Revoke(ctx context.Context, digest string) error {
	return f.change(ctx, func(s keyStore) error { return s.Revoke(ctx, digest) })
}

func (f *fileKeys) Rotate(ctx context.Context, old string, next auth.Entry, oldEnds time.Time) (auth.Entry, error) {
	var prev auth.Entry
	err := f.change(ctx, func(s keyStore) error {
		var err error
		prev, err = s.Rotate(ctx, old, next, oldEnds)
		return err
	})
	return prev, err
}

func (f *fileKeys) List(ctx context.Context) ([]auth.Entry, error) {
	return f.mem.List(ctx)
}

// Lookup lets the admin endpoints read an entry back after a change.
func (f *fileKeys) Lookup(ctx context.Context, digest string) (auth.Entry, bool, error) {
	return f.mem.Lookup(ctx, digest)
}

func (f *fileKeys) change(ctx context.Context, op func(keyStore) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := withStore(ctx, &config.Config{Auth: config.Auth{KeysFile: f.path}}, op); err != nil {
		return err
	}
	entries, err := auth.LoadKeysFile(f.path)
	if err != nil {
		return fmt.Errorf("keys file %s: %w", f.path, err)
	}
	return f.mem.Replace(entries)
}
