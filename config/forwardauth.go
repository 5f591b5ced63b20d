package config

// ForwardAuth is the forward-auth door: an endpoint that nginx (auth_request), Caddy
// (forward_auth), Traefik (ForwardAuth) and Envoy (ext_authz over HTTP) ask before they pass a
// request to the platform themselves. The gateway decides the route, the key and the route's
// request limits, and answers 2xx with the rate-limit headers and the tenant, or the refusal.
type ForwardAuth struct {
	// Listen is the forward-auth listener's address; empty (the default) turns the door off.
	// It is never the public or the admin listener. A change needs a restart.
	Listen string `yaml:"listen"`
	// Path is where the door answers (default /auth). Envoy's ext_authz, which appends the
	// original path to its path_prefix, asks below it (/auth/v2/agent/...).
	Path string `yaml:"path"`
	// TrustedProxies are the CIDRs (or single addresses) of the proxies that ask: only their
	// X-Original-*, X-Forwarded-* headers are believed, and any other peer is refused
	// (default loopback: 127.0.0.1/32 and ::1/128). The client address is the right-most
	// X-Forwarded-For entry that is neither one of these nor in client_ip.trusted_proxies.
	TrustedProxies []string `yaml:"trusted_proxies"`
}

// Enabled reports whether the forward-auth listener runs.
func (f ForwardAuth) Enabled() bool { return f.Listen != "" }

// forwardAuthDefaults are the defaults of forward_auth.
func forwardAuthDefaults() ForwardAuth {
	return ForwardAuth{Path: "/auth", TrustedProxies: []string{"127.0.0.1/32", "::1/128"}}
}

// forwardAuth checks forward_auth (the routes served only through it are checked where routes
// are compiled: what their limits need is known there).
func (v *validator) forwardAuth(c *Config) {
	f := c.ForwardAuth
	if !f.Enabled() {
		for i, r := range c.Routes {
			if r.ForwardAuthOnly {
				v.fail(indexKey("routes", i)+".forward_auth_only", "needs forward_auth.listen: without it no door would serve %s", r.Name)
			}
		}
		return
	}
	v.listenAddr("forward_auth.listen", f.Listen)
	if f.Listen == c.Listen || f.Listen == c.AdminListen {
		v.fail("forward_auth.listen", "%q must differ from listen and admin_listen", f.Listen)
	}
	v.plainPath("forward_auth.path", f.Path, "/auth")
	if len(f.TrustedProxies) == 0 {
		v.fail("forward_auth.trusted_proxies", "must list the proxies that ask (CIDRs or addresses): any other peer is refused")
	}
	for i, p := range f.TrustedProxies {
		if _, err := ParsePrefix(p); err != nil {
			v.fail(indexKey("forward_auth.trusted_proxies", i), "%q is not a CIDR or IP address", p)
		}
	}
}
