package engine

import (
	"context"
	"fmt"

	"github.com/docsgate/gateway/auth"
)

// maxRotations bounds how far a lineage is followed to its newest key: a chain longer than
// this (a key rotated daily for weeks) shows the tenant as the key this many rotations on.
const maxRotations = 64

// key finds the registered key of digest: what the limits that count by key count it as (its
// lineage's first digest: the keys of a rotation are one tenant) and the lineage's newest key,
// whose org, plan and label are the tenant's. found is false for a digest the registry does
// not know (or with no registry): then id is digest.
func (e *Engine) key(ctx context.Context, digest string) (newest auth.Entry, id string, found bool, err error) {
	if e.o.Registry == nil {
		return auth.Entry{}, digest, false, nil
	}
	k, ok, err := e.o.Registry.Lookup(ctx, digest)
	if err != nil || !ok {
		return auth.Entry{}, digest, false, wrapRegistry(err)
	}
	id = k.Tenant()
	for range maxRotations {
		if k.RotatedTo == "" {
			break
		}
		next, ok, err := e.o.Registry.Lookup(ctx, k.RotatedTo)
		if err != nil {
			return auth.Entry{}, id, false, wrapRegistry(err)
		}
		if !ok {
			break
		}
		k = next
	}
	return k, id, true, nil
}

func wrapRegistry(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("engine: key registry: %w", err)
}
