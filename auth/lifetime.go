package auth

import (
	"errors"
	"fmt"
	"time"

	"github.com/docsgate/gateway/internal/days"
)

// Lifetime bounds the expiry of the keys of one kind registered or rotated (auth.key_lifetime):
// Default is the lifetime of a key registered without an expiry (0: Max), Max the longest
// one a key may be given (0: no bound).
type Lifetime struct {
	Default, Max time.Duration
}

// Lifetimes are the lifetimes of each kind.
type Lifetimes struct {
	Admin, Assistant Lifetime
}

// For is the lifetime of kind k.
func (l Lifetimes) For(k Kind) Lifetime {
	if k == Assistant {
		return l.Assistant
	}
	return l.Admin
}

// ErrExpiryPast is Expiry's error for an expiry that is not in the future.
var ErrExpiryPast = errors.New("the expiry must be in the future")

// Expiry is the expiry of a key registered at now: requested when given (in the future, and
// within Max of now), else now plus Default, else now plus Max; nil when neither is set.
func (l Lifetime) Expiry(requested *time.Time, now time.Time) (*time.Time, error) {
	if requested != nil {
		switch {
		case !requested.After(now):
			return nil, ErrExpiryPast
		case l.Max > 0 && requested.After(now.Add(l.Max)):
			return nil, fmt.Errorf("the expiry is past the longest lifetime of a key of this kind (%s from now)", days.Format(l.Max))
		}
		t := requested.UTC().Round(0)
		return &t, nil
	}
	d := l.Default
	if d == 0 {
		d = l.Max
	}
	if d == 0 {
		return nil, nil
	}
	t := now.Add(d).UTC().Truncate(time.Second)
	return &t, nil
}
