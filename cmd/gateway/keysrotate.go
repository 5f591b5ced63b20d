package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/docsgate/gateway/admin"
	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/internal/days"
	"github.com/docsgate/gateway/policy"
)

// runKeysRotate is `gateway keys rotate`: it issues the successor of a registered key (the
// same org, grants, plan, label and scopes, one tenant with it for every limit that counts by
// key), prints the new key once on standard output, and schedules the old key's end after
// --overlap.
func runKeysRotate(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("gateway keys rotate")
	configPath := fs.String("config", "", "path to the gateway's YAML config file")
	keyStdin := fs.Bool("key-stdin", false, "read the key to rotate from standard input instead of giving its DIGEST")
	overlapFlag := fs.String("overlap", days.Format(admin.DefaultOverlap), "how long the old key keeps working (24h, 7d; 0s: it ends now)")
	expiresFlag := fs.String("expires", "", "the new key's expiry: a lifetime (90d, 36h), a date or an RFC 3339 time; default: the kind's default lifetime")
	positional, code, done := parseCommand(fs, args, "keys", stdout, stderr)
	if done {
		return code
	}
	usage := func(format string, a ...any) int {
		return usageError(stderr, "keys", "keys rotate: %s", fmt.Sprintf(format, a...))
	}
	switch {
	case *configPath == "":
		return usage("-config FILE is required")
	case *keyStdin && len(positional) != 0:
		return usage("with --key-stdin the key is read from standard input and no argument is taken (never the key)")
	case !*keyStdin && len(positional) != 1:
		return usage("want exactly one DIGEST (from gateway keys list), or --key-stdin")
	case !*keyStdin && !auth.ValidDigest(positional[0]):
		return usage("not a digest: want 64 lower-case hex characters (gateway keys list shows them)")
	}
	overlap, err := days.Parse(*overlapFlag)
	if err != nil || overlap < 0 {
		return usage("--overlap: want a duration such as 24h or 7d (0s ends the old key now)")
	}
	now := time.Now()
	var expires *time.Time
	if *expiresFlag != "" {
		t, err := parseExpires(*expiresFlag, now)
		if err != nil {
			return usage("--expires: %v", err)
		}
		expires = &t
	}
	cfg, err := config.Load(*configPath, os.LookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "gateway keys: %v\n", err)
		return exitUsage
	}
	if cfg.Auth.Mode != "registry" {
		return usage("%s runs auth.mode %s: the gateway knows no keys there (any key of the right prefix is forwarded), so there is nothing to rotate; rotate the key on the platform itself", *configPath, cfg.Auth.Mode)
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "gateway keys rotate: %v\n", err)
		return exitFailure
	}
	digest := ""
	if *keyStdin {
		if digest, err = digestFromStdin(stdin, stderr); err != nil {
			return fail(err)
		}
	} else {
		digest = positional[0]
	}
	ctx, cancel := context.WithTimeout(ctx, keysTimeout)
	defer cancel()
	var key string
	var next, prev auth.Entry
	err = withStore(ctx, cfg, func(s keyStore) error {
		old, found, err := s.Lookup(ctx, digest)
		if err != nil {
			return err
		}
		if !found {
			return auth.ErrUnknownKey
		}
		kind, _ := auth.ParseKind(old.Kind)
		exp, err := keyLifetimes(cfg).For(kind).Expiry(expires, now)
		if err != nil {
			return fmt.Errorf("--expires: %w", err)
		}
		if key, err = auth.Generate(kind); err != nil {
			return err
		}
		next = auth.Successor(old, auth.Digest(key), exp)
		prev, err = s.Rotate(ctx, digest, next, now.Add(overlap))
		return err
	})
	if errors.Is(err, auth.ErrUnknownKey) {
		return fail(errors.New("no key with this digest is registered"))
	}
	if err != nil {
		return fail(err)
	}
	// The key goes to standard output alone, so `> key.txt` captures exactly it.
	fmt.Fprintln(stdout, key)
	fmt.Fprintf(stderr, "gateway keys rotate: registered digest %s (expires %s); %s works until %s\n",
		next.Digest, timeOrNever(next.Expires), prev.Digest, timeOrNever(prev.Ends()))
	reloadHint(stderr, cfg)
	return exitOK
}

// parseExpires reads an expiry: a lifetime from now (90d, 36h), a date (midnight UTC) or an
// RFC 3339 time.
func parseExpires(s string, now time.Time) (time.Time, error) {
	if d, err := days.Parse(s); err == nil {
		if d <= 0 {
			return time.Time{}, auth.ErrExpiryPast
		}
		return now.Add(d).UTC().Truncate(time.Second), nil
	}
	t, err := config.ParseDate(s)
	if err != nil {
		return time.Time{}, errors.New("want a lifetime (90d, 36h), a date (2027-01-01) or an RFC 3339 time")
	}
	return t, nil
}

// keyLifetimes are the config's key lifetimes (auth.key_lifetime).
func keyLifetimes(cfg *config.Config) auth.Lifetimes {
	of := func(l config.KeyLifetime) auth.Lifetime {
		return auth.Lifetime{Default: time.Duration(l.Default), Max: time.Duration(l.Max)}
	}
	return auth.Lifetimes{Admin: of(cfg.Auth.KeyLifetime.Admin), Assistant: of(cfg.Auth.KeyLifetime.Assistant)}
}

// timeOrNever writes t in RFC 3339, "never" when nil.
func timeOrNever(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}

// setExpiry sets the expiry of e, to register now in s: the one asked for, within its kind's
// longest lifetime, else (for a key not registered yet) its kind's default lifetime; an
// update of a registered key without one keeps the key's.
func setExpiry(ctx context.Context, s keyStore, e *auth.Entry, asked *time.Time, lt auth.Lifetimes) error {
	if asked == nil {
		_, found, err := s.Lookup(ctx, e.Digest)
		if err != nil || found {
			return err
		}
	}
	exp, err := lt.For(mustKind(e.Kind)).Expiry(asked, time.Now())
	if err != nil {
		return fmt.Errorf("--expires: %w", err)
	}
	e.Expires = exp
	return nil
}

// unknownScope finds a scope of e that names no route of e's kind in cfg (its routes compiled:
// the built-in ones and the config's); ok is true when every scope names one.
func unknownScope(cfg *config.Config, e *auth.Entry) (scope string, ok bool) {
	if len(e.Scopes) == 0 {
		return "", true
	}
	p, err := policy.Compile(cfg, nil)
	if err != nil {
		return "", true // config.Load validated it; the gateway refuses such a config anyway
	}
	for _, sc := range e.Scopes {
		if kind, found := p.RouteKind(sc); !found || kind.String() != e.Kind {
			return sc, false
		}
	}
	return "", true
}
