package config

import (
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Validate reports every problem at once, without side effects.
func (c *Config) Validate() error {
	var v validator
	v.listenAddr("listen", c.Listen)
	v.listenAddr("admin_listen", c.AdminListen)
	if c.Listen != "" && c.Listen == c.AdminListen {
		v.fail("admin_listen", "must differ from listen: metrics and health never share the public listener")
	}
	v.tls("tls", c.TLS)
	v.tls("admin_tls", c.AdminTLS)
	for i, h := range c.AdminHosts {
		if !validHostName(h) {
			v.fail(indexKey("admin_hosts", i), "%q is not a host name such as gateway-admin.example.com (no port, no scheme)", h)
		}
	}
	v.upstream(&c.Upstream)
	if c.MaxBodyBytes <= 0 {
		v.fail("max_body_bytes", "must be a positive number of bytes")
	}
	for i, p := range c.ClientIP.TrustedProxies {
		if _, err := ParsePrefix(p); err != nil {
			v.fail(indexKey("client_ip.trusted_proxies", i), "%q is not a CIDR or IP address", p)
		}
	}
	for i, o := range c.CORS.AllowedOrigins {
		if !validOrigin(o) {
			v.fail(indexKey("cors.allowed_origins", i), "%q is not \"*\" or an origin such as https://docs.example.com", o)
		}
	}
	v.nonNegative("cors.max_age", c.CORS.MaxAge)
	v.positive("server.read_header_timeout", c.Server.ReadHeaderTimeout)
	v.positive("server.read_body_timeout", c.Server.ReadBodyTimeout)
	v.positive("server.idle_timeout", c.Server.IdleTimeout)
	if d := c.Server.WriteStallTimeout; d < 0 || d > 0 && d < time.Second {
		// Shorter would cut healthy clients whose reading pauses for a moment.
		v.fail("server.write_stall_timeout", "%s: must be at least 1s (0 turns it off)", d)
	}
	v.nonNegative("server.shutdown_delay", c.Server.ShutdownDelay)
	v.nonNegative("server.shutdown_grace", c.Server.ShutdownGrace)
	if c.Server.MaxHeaderBytes < 1024 {
		v.fail("server.max_header_bytes", "must be at least 1024")
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		v.fail("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	switch c.Log.Format {
	case "json", "console":
	default:
		v.fail("log.format", "%q is not one of json, console", c.Log.Format)
	}
	if c.Log.Buffer < 0 {
		v.fail("log.buffer", "must not be negative (0 writes every line at once)")
	}
	if c.Log.Sampling.Initial < 0 || c.Log.Sampling.Thereafter < 0 {
		v.fail("log.sampling", "initial and thereafter must not be negative")
	}
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		v.fail("admin_token", "must be at least 16 characters (or empty to disable)")
	}
	if c.AdminUIRefresh != 0 && c.AdminUIRefresh < time.Second {
		v.fail("admin_ui_refresh", "must be at least 1s (or 0 to never refresh)")
	}
	if c.AdminMaxExports < 1 {
		v.fail("admin_max_exports", "must be at least 1: each export holds a sorted set of every tenant in Redis while it runs")
	}
	switch c.Auth.Mode {
	case "prefix", "registry":
	default:
		v.fail("auth.mode", "%q is not prefix or registry", c.Auth.Mode)
	}
	v.positive("auth.cache_ttl", c.Auth.CacheTTL)
	if c.Auth.Mode == "registry" && len(c.Redis.Addrs) == 0 && c.Auth.KeysFile == "" {
		// An in-memory registry alone would lose every key and every revocation on the next
		// reload or restart, and a revoked key could then be registered and used again.
		v.fail("auth.mode", "registry needs somewhere to keep keys: set redis.addrs (shared by every replica) or auth.keys_file")
	}
	switch c.Tracing.Protocol {
	case "", "http/protobuf", "grpc":
	default:
		v.fail("tracing.protocol", "%q is not http/protobuf or grpc", c.Tracing.Protocol)
	}
	if r := c.Tracing.SampleRatio; r != nil && (*r < 0 || *r > 1) {
		v.fail("tracing.sample_ratio", "must be between 0 and 1")
	}
	for k := range c.Tracing.Headers {
		if k == "" || strings.ContainsAny(k, " \t\r\n:") {
			v.fail("tracing.headers", "%q is not a header name", k)
		}
	}
	if c.Auth.FailureLimit < 0 {
		v.fail("auth.failure_limit", "must not be negative (0 disables it)")
	}
	v.keyLifetime("auth.key_lifetime.admin", c.Auth.KeyLifetime.Admin)
	v.keyLifetime("auth.key_lifetime.assistant", c.Auth.KeyLifetime.Assistant)
	v.nonNegative("auth.expiry_notice", time.Duration(c.Auth.ExpiryNotice))
	v.routes(c.Routes)
	v.limits(c)
	v.selfUsage(c.SelfUsage)
	v.notifications(c)
	v.rateLimitService(c)
	v.forwardAuth(c)
	if len(v.problems) > 0 {
		return &Error{Problems: redactProblems(v.problems, c.Secrets())}
	}
	return nil
}

type validator struct {
	decoder
}

func (v *validator) tls(key string, t *TLS) {
	if t == nil {
		return
	}
	if t.CertFile == "" {
		v.fail(key+".cert_file", "is required when %s is set", key)
	}
	if t.KeyFile == "" {
		v.fail(key+".key_file", "is required when %s is set", key)
	}
}

// validHostName accepts a DNS name (letters, digits, hyphens and dots; no port, no scheme).
func validHostName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

func (v *validator) listenAddr(key, addr string) {
	if addr == "" {
		v.fail(key, "is required")
		return
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		v.fail(key, "%q is not host:port", addr)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		v.fail(key, "%q has no valid port", addr)
	}
}

func (v *validator) upstream(u *Upstream) {
	switch parsed, err := url.Parse(u.URL); {
	case u.URL == "":
		v.fail("upstream.url", "is required (or set GATEWAY_UPSTREAM_URL)")
	case err != nil:
		v.fail("upstream.url", "%q is not a URL", u.URL)
	case parsed.Scheme != "http" && parsed.Scheme != "https":
		v.fail("upstream.url", "%q must start with http:// or https://", u.URL)
	case parsed.Host == "":
		v.fail("upstream.url", "%q has no host", u.URL)
	case parsed.User != nil:
		v.fail("upstream.url", "must not carry credentials")
	case parsed.RawQuery != "" || parsed.Fragment != "":
		v.fail("upstream.url", "must not have a query or fragment")
	}
	v.positive("upstream.timeout", u.Timeout)
	v.positive("upstream.dial_timeout", u.DialTimeout)
	v.positive("upstream.idle_timeout", u.IdleTimeout)
	if u.MaxIdleConns < 0 {
		v.fail("upstream.max_idle_conns", "must not be negative")
	}
	if u.Transport != "pool" && u.Transport != "standard" {
		v.fail("upstream.transport", "%q is not pool or standard", u.Transport)
	}
}

var (
	routeName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)
	// A method is an HTTP token; upper case keeps route tables unambiguous.
	routeMethod = regexp.MustCompile(`^[A-Z]{1,16}$`)
)

// routes checks each entry's form; the proxy checks how routes fit together when it compiles
// them (conflicting patterns, changes to built-in routes).
func (v *validator) routes(routes []Route) {
	names := make(map[string]bool, len(routes))
	for i, r := range routes {
		key := indexKey("routes", i)
		if !routeName.MatchString(r.Name) {
			v.fail(key+".name", "%q must be lower_snake_case (it becomes a metric label)", r.Name)
		} else if names[r.Name] {
			v.fail(key+".name", "%q is used by another route", r.Name)
		}
		names[r.Name] = true
		if r.Method != "" && !routeMethod.MatchString(r.Method) {
			v.fail(key+".method", "%q is not an upper-case HTTP method", r.Method)
		}
		if r.Path != "" && (!strings.HasPrefix(r.Path, "/") || strings.ContainsAny(r.Path, " \t?#")) {
			v.fail(key+".path", "%q must be a path pattern starting with / such as /v2/agent/{projectId}/job", r.Path)
		}
		if r.Key != "" && r.Key != "admin" && r.Key != "assistant" {
			v.fail(key+".key", "%q is not admin or assistant", r.Key)
		}
		if d := r.Deprecation; d != nil {
			v.deprecation(key+".deprecation", d)
		}
		if r.MaxMessages != nil && *r.MaxMessages < 0 {
			v.fail(key+".max_messages", "must not be negative (0: no bound but max_body_bytes)")
		}
		if r.MaxPartsPerMessage != nil && *r.MaxPartsPerMessage < 0 {
			v.fail(key+".max_parts_per_message", "must not be negative (0: no bound but max_body_bytes)")
		}
	}
}

func (v *validator) deprecation(key string, d *Deprecation) {
	since, err := ParseDate(d.Since)
	if err != nil {
		v.fail(key+".since", "%q is not a date such as 2025-06-01 (or an RFC 3339 time)", d.Since)
	}
	if d.Sunset != "" {
		sunset, err := ParseDate(d.Sunset)
		switch {
		case err != nil:
			v.fail(key+".sunset", "%q is not a date such as 2026-12-31 (or an RFC 3339 time)", d.Sunset)
		case !since.IsZero() && sunset.Before(since):
			v.fail(key+".sunset", "must not be earlier than since (RFC 8594)")
		}
	}
	if d.Link != "" {
		if u, err := url.Parse(d.Link); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			v.fail(key+".link", "%q is not an absolute http(s) URL", d.Link)
		}
	}
}

// ParseDate accepts a calendar date (midnight UTC) or an RFC 3339 time.
func ParseDate(s string) (time.Time, error) {
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Parse(time.RFC3339, s)
}

func (v *validator) positive(key string, d time.Duration) {
	if d <= 0 {
		v.fail(key, "must be a positive duration such as 30s")
	}
}

func (v *validator) keyLifetime(key string, l KeyLifetime) {
	v.nonNegative(key+".default", time.Duration(l.Default))
	v.nonNegative(key+".max", time.Duration(l.Max))
	if l.Max > 0 && l.Default > l.Max {
		v.fail(key+".default", "is longer than %s.max", key)
	}
}

func (v *validator) nonNegative(key string, d time.Duration) {
	if d < 0 {
		v.fail(key, "must not be negative")
	}
}

func indexKey(key string, i int) string {
	return key + "[" + strconv.Itoa(i) + "]"
}

// ParsePrefix accepts a CIDR or a single address (as a /32 or /128).
func ParsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func validOrigin(o string) bool {
	if o == "*" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" &&
		u.Path == "" && u.RawQuery == "" && u.Fragment == "" && u.User == nil
}
