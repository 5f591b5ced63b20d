package proxy

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.uber.org/zap"

	"github.com/docsgate/gateway/apierror"
	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/tracing"
)

// KeyLookup finds registered keys by digest (auth.mode: registry). It answers from a local
// cache in steady state.
type KeyLookup interface {
	Lookup(ctx context.Context, digest string) (auth.Entry, bool, error)
}

// keyCheck authenticates requests: a key's family by prefix and, in registry mode, its entry
// in the registry; and it keeps each client's budget of failed authentications
// (auth.failure_limit, authfail.go).
type keyCheck struct {
	registry KeyLookup // nil: prefix mode
	failures *auth.FailureBudget
	tracing  *tracing.Spans // nil: off
	lastUse  *auth.LastUse  // registry mode: each key's last use; nil: none kept
	log      *zap.Logger
}

// authenticate checks the key for the route: its family by prefix and, in registry mode,
// that it is registered, not revoked and granted the path's project or domain. It also
// settles the tenant (org and plan) the limits count for. It answers the request itself and
// returns false when the key is refused.
func (k *keyCheck) authenticate(s *scope, r *http.Request) bool {
	rt := s.route
	if k.spent(s) {
		return false
	}
	header := r.Header.Get("Authorization")
	if len(r.Header["Authorization"]) > 1 {
		// Which one would the upstream believe? Refuse rather than guess.
		header = "malformed"
	}
	id, reason := auth.Check(header, rt.Key)
	if reason != 0 {
		k.reject(s, reason.String(), reason)
		return false
	}
	s.digest = id.Digest
	if k.registry == nil {
		if rt.HasDomain {
			s.org = s.snap.pol.OrgOf(r.PathValue("domain")) // an unmapped domain is an org of its own
		}
		s.plan = s.snap.pol.PlanOf(s.org)
		return true
	}
	return k.registered(s, r, id.Digest)
}

// cachedRegistry is a registry that can answer from what it holds in process, with no I/O
// (hit false: it must look further).
type cachedRegistry interface {
	LookupCached(digest string) (e auth.Entry, ok, hit bool)
}

// authSpanAttrs are the auth span's attributes, made once.
var authSpanAttrs = []attribute.KeyValue{attribute.String("gateway.auth.mode", "registry")}

// lookup finds the key's registry entry: from the registry's cache when it holds it (most
// requests, within auth.cache_ttl), with no trace span, since nothing left the process; else
// from the registry under an auth span.
func (k *keyCheck) lookup(r *http.Request, digest string) (auth.Entry, bool, error) {
	if c, isCached := k.registry.(cachedRegistry); isCached {
		if e, ok, hit := c.LookupCached(digest); hit {
			return e, ok, nil
		}
	}
	ctx, span := k.tracing.Child(r.Context(), "auth", authSpanAttrs...)
	e, ok, err := k.registry.Lookup(ctx, digest)
	if span != nil {
		if err != nil {
			span.SetStatus(codes.Error, "auth_unavailable")
		}
		span.End()
	}
	return e, ok, err
}

// registered looks the key's digest up in the registry (auth.mode: registry): it
// must be registered, active, of the route's family and granted the path's project or domain.
// The tenant is then the entry's org and plan.
func (k *keyCheck) registered(s *scope, r *http.Request, digest string) bool {
	rt := s.route
	e, ok, err := k.lookup(r, digest)
	switch {
	case err != nil:
		k.log.Warn("key registry unavailable", zap.String("request_id", s.requestID), zap.Error(err))
		s.w.Header()[hdrRetryAfter] = retryAfterOne
		s.fail(http.StatusServiceUnavailable, apierror.Body{
			Error: "Key checks are temporarily unavailable. Please retry in a moment.",
			Code:  apierror.AuthUnavailable,
		})
		return false
	case !ok:
		k.reject(s, "unknown_key", auth.UnknownFamily)
		return false
	case e.RevokedAt(s.start):
		k.reject(s, "revoked", auth.UnknownFamily)
		return false
	case e.Expired(s.start):
		k.reject(s, "expired", auth.Expired)
		return false
	case e.Kind != rt.Key.String():
		// An entry registered by digest carries the kind its registrant said; the prefix is
		// what the platform goes by. Never read one family's grants as the other's (domains
		// as projects).
		k.reject(s, "wrong_key_type", auth.WrongKind)
		return false
	}
	if resource := grantedResource(rt, r); resource != "" && !e.Allows(resource) {
		s.route.metrics.AuthRejected("forbidden")
		what := "project"
		if rt.Key == auth.Assistant {
			what = "documentation site"
		}
		s.fail(http.StatusForbidden, apierror.Body{Error: "This API key is not allowed for this " + what + ".", Code: apierror.Forbidden})
		return false
	}
	if !e.AllowsRoute(rt.Name) {
		s.route.metrics.AuthRejected("out_of_scope")
		s.fail(http.StatusForbidden, apierror.Body{Error: "This API key may not call this endpoint: its scopes do not name it.", Code: apierror.OutOfScope})
		return false
	}
	if k.lastUse != nil {
		k.lastUse.Touch(digest, s.start) // in memory: written to the store once a minute
	}
	s.digest = e.Tenant() // what the limits by key count: the key's lineage
	s.org = e.Org
	s.plan = e.Plan
	s.label = e.Label
	if s.plan == "" {
		s.plan = s.snap.pol.PlanOf(s.org)
	}
	return true
}

// grantedResource is what a registered key must be granted for this request: the project of
// admin routes, the domain of assistant routes ("" when the path names neither).
func grantedResource(rt *route, r *http.Request) string {
	if rt.Key == auth.Admin {
		return r.PathValue("projectId")
	}
	return r.PathValue("domain")
}

// reject answers a request refused for its credentials: 401 with a Bearer challenge, or
// 403 for a key of the other family. label is the metric's reason.
func (k *keyCheck) reject(s *scope, label string, reason auth.Reason) {
	s.route.metrics.AuthRejected(label)
	if reason != auth.WrongKind { // a 401: a failed authentication
		k.fail(s)
	}
	switch reason {
	case auth.WrongKind:
		msg := "This endpoint needs an admin API key (svc_...); assistant keys (svc_dsc_...) cannot be used here."
		if s.route.Key == auth.Assistant {
			msg = "This endpoint needs an assistant API key (svc_dsc_...); admin keys must never be used from browsers."
		}
		s.fail(http.StatusForbidden, apierror.Body{Error: msg, Code: apierror.WrongKeyType})
	case auth.Expired:
		s.w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token", error_description="the key has expired"`)
		s.fail(http.StatusUnauthorized, apierror.Body{Error: "This API key has expired.", Code: apierror.KeyExpired})
	case auth.Missing:
		s.w.Header().Set("WWW-Authenticate", "Bearer")
		s.fail(http.StatusUnauthorized, apierror.Body{
			Error: "Missing API key: send it as \"Authorization: Bearer <key>\".",
			Code:  apierror.MissingCredentials,
		})
	default:
		s.w.Header().Set("WWW-Authenticate", "Bearer")
		s.fail(http.StatusUnauthorized, apierror.Body{Error: "Invalid API key.", Code: apierror.InvalidCredentials})
	}
}
