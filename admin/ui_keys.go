package admin

import (
	"context"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/auth"
)

// The usage page's keys ending soon (registry mode): every key whose end, its expiry or a
// revocation scheduled (a rotation's overlap), comes within the expiry notice, soonest first,
// with its last use, so that an operator sees what is about to stop working and whether
// anyone still uses it.

// uiEndingKeys is how many keys ending soon the page lists.
const uiEndingKeys = 50

type endingKeysView struct {
	Notice time.Duration
	Keys   []endingKeyView
	More   int // keys ending soon not listed
	Error  string
}

type endingKeyView struct {
	auth.Entry
	Ends time.Time
	// Why is "expires" or "revoked" (a scheduled revocation, as a rotation's overlap ends).
	Why string
}

// endingKeys reads the registry and the last uses, and lists the keys ending within notice.
func (u *ui) endingKeys(ctx context.Context, notice time.Duration) *endingKeysView {
	ctx, cancel := context.WithTimeout(ctx, u.o.UsageTimeout)
	defer cancel()
	v := &endingKeysView{Notice: notice}
	list, err := u.o.Keys.List(ctx)
	if err != nil {
		u.o.Logger.Warn("usage page: reading the key registry failed", zap.Error(err))
		v.Error = "The key registry could not be read just now; the page tries again at its next refresh."
		return v
	}
	now := time.Now()
	for _, e := range list {
		ends := e.Ends()
		if ends == nil || !ends.After(now) || ends.Sub(now) > notice {
			continue
		}
		why := "expires"
		if e.Revoked != nil && !e.Revoked.After(*ends) {
			why = "revoked"
		}
		v.Keys = append(v.Keys, endingKeyView{Entry: e, Ends: *ends, Why: why})
	}
	slices.SortFunc(v.Keys, func(a, b endingKeyView) int { return a.Ends.Compare(b.Ends) })
	if len(v.Keys) > uiEndingKeys {
		v.More, v.Keys = len(v.Keys)-uiEndingKeys, v.Keys[:uiEndingKeys]
	}
	if len(v.Keys) > 0 && u.o.KeyLastUse != nil {
		if uses, err := u.o.KeyLastUse.Load(ctx); err == nil {
			for i := range v.Keys {
				if t, ok := uses[v.Keys[i].Digest]; ok {
					v.Keys[i].LastUsed = &t
				}
			}
		}
	}
	return v
}
