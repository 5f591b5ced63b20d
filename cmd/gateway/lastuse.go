package main

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
)

// lastUseFlushEvery is how often a replica writes the last uses it recorded: the minute the
// store keeps them to.
const lastUseFlushEvery = time.Minute

// lastUseStore is where the keys' last uses are kept (registry mode): beside the keys in
// Redis, else in a file beside the keys file (<keys_file>.last-used); nil with neither.
func lastUseStore(cfg *config.Config, client redis.UniversalClient) auth.LastUseStore {
	switch {
	case client != nil:
		return auth.NewRedisLastUse(client, cfg.Redis.KeyPrefix)
	case cfg.Auth.KeysFile != "":
		return &auth.FileLastUse{Path: cfg.Auth.KeysFile + ".last-used"}
	}
	return nil
}

// loadLastUse reads the last uses for `gateway keys list`; none without a store.
func loadLastUse(ctx context.Context, cfg *config.Config) (map[string]time.Time, error) {
	var client redis.UniversalClient
	if len(cfg.Redis.Addrs) > 0 {
		client = newKeysRedisClient(cfg.Redis)
		defer client.Close()
	}
	s := lastUseStore(cfg, client)
	if s == nil {
		return nil, nil
	}
	minutes, err := s.LoadLastUse(ctx)
	if err != nil {
		return nil, err
	}
	return auth.Minutes(minutes), nil
}

// flushLastUse writes lu's recorded uses every lastUseFlushEvery until ctx ends, then once
// more (bounded by timeout), so a replica stopping loses none it recorded.
func flushLastUse(ctx context.Context, lu *auth.LastUse, timeout time.Duration, warn func(error)) {
	t := time.NewTicker(lastUseFlushEvery)
	defer t.Stop()
	flush := func(parent context.Context) {
		fctx, cancel := context.WithTimeout(parent, timeout)
		defer cancel()
		if err := lu.Flush(fctx); err != nil {
			warn(err)
		}
	}
	for {
		select {
		case <-t.C:
			flush(ctx)
		case <-ctx.Done():
			flush(context.WithoutCancel(ctx))
			return
		}
	}
}
