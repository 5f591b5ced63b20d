// Package config is the gateway's documented config file: schema, defaults and validation.
//
// Strict YAML decoding that names the offending key, defaults, environment overrides and a
// Validate that reports every problem.
package config

import (
	"fmt"
	"time"

	"gopkg.in/yaml.v3"
)

// Config is the whole file. Every key is optional except upstream.url; config.example.yaml
// documents each one. Zero values are replaced by Defaults before validation.
type Config struct {
	// Listen is the public listener's address.
	Listen string `yaml:"listen"`
	// AdminListen serves /metrics, /healthz and /readyz; it is never the public listener.
	AdminListen string `yaml:"admin_listen"`
	// AdminToken, when set, is required on every admin endpoint but /healthz and /readyz:
	// as a bearer token, or as the password of HTTP Basic auth (for browsers).
	AdminToken string `yaml:"admin_token"`
	// AdminUIRefresh is how often the usage page (/ui/ on the admin listener) refreshes
	// itself; 0 never.
	AdminUIRefresh time.Duration `yaml:"admin_ui_refresh"`
	// AdminHosts are the host names (besides IP literals and localhost) the admin listener
	// answers to; a request naming any other Host gets 421, so a DNS-rebinding page cannot
	// reach it through a name of the attacker's. List the name of an ingress in front of it.
	AdminHosts []string `yaml:"admin_hosts"`
	// AdminTLS, when set, makes the admin listener serve HTTPS; unset, it follows TLS.
	AdminTLS *TLS `yaml:"admin_tls"`
	// AdminMaxExports is how many GET /usage/export answers one replica runs at once (each
	// holds a sorted set of every tenant of the window in Redis while it runs); beyond, 429
	// too_many_exports. At least 1; a change needs a restart.
	AdminMaxExports int `yaml:"admin_max_exports"`
	// TLS, when set, makes the public listener serve HTTPS (HTTP/1.1 and HTTP/2), and the
	// admin listener too unless AdminTLS names other files.
	TLS *TLS `yaml:"tls"`

	Upstream Upstream `yaml:"upstream"`
	// MaxBodyBytes caps request bodies; larger ones get 413 before anything is forwarded.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`

	ClientIP ClientIP `yaml:"client_ip"`
	CORS     CORS     `yaml:"cors"`
	Server   Server   `yaml:"server"`
	Log      Log      `yaml:"log"`

	// Routes adds pass-through routes, or adjusts the built-in ones by naming them.
	Routes []Route `yaml:"routes"`

	// Redis holds the limit counters shared by all replicas; without addrs, counters are
	// kept in process.
	Redis Redis `yaml:"redis"`
	// Orgs maps an organization to its assistant domains, as a list, or as
	// {domains: [...], plan: NAME} to give the organization a plan.
	Orgs map[string]Org `yaml:"orgs"`
	// Plans are named sets of limit overrides; an org or a registered key may name one.
	Plans map[string]map[string]Limit `yaml:"plans"`
	// Limits defines or adjusts limits by name; routes apply them.
	Limits map[string]Limit `yaml:"limits"`
	// Quota configures run-time quota changes (grants, overrides, resets on the admin
	// listener) and their audit trail.
	Quota Quota `yaml:"quota"`

	// Auth says how keys are checked: by prefix alone, or against a registry of keys.
	Auth Auth `yaml:"auth"`

	// Tracing exports OpenTelemetry traces of every request (OTLP).
	Tracing Tracing `yaml:"tracing"`

	// SelfUsage is the tenants' own usage endpoint on the public listener (selfusage.go).
	SelfUsage SelfUsage `yaml:"self_usage"`

	// Notifications sends signed webhooks on quota events (notifications.go).
	Notifications Notifications `yaml:"notifications"`

	// RateLimitService serves Envoy's rate limit service over gRPC (ratelimitservice.go);
	// nil: not served.
	RateLimitService *RateLimitService `yaml:"rate_limit_service"`

	// ForwardAuth is the forward-auth door for nginx, Caddy, Traefik and Envoy
	// (forwardauth.go); off unless forward_auth.listen is set.
	ForwardAuth ForwardAuth `yaml:"forward_auth"`
}

// Tracing configures OpenTelemetry tracing. What the file leaves empty comes from the standard
// OTEL_* environment variables, then from the defaults; OTEL_SDK_DISABLED=true turns tracing
// off whatever the file says.
type Tracing struct {
	Enabled bool `yaml:"enabled"`
	// Endpoint of the OTLP receiver: a URL (http://collector:4318 for http/protobuf, where
	// /v1/traces is added when no path is given; collector:4317 or http://collector:4317 for
	// grpc). Empty: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT, then the
	// exporter's default (localhost).
	Endpoint string `yaml:"endpoint"`
	// Protocol is http/protobuf or grpc. Empty: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
	// OTEL_EXPORTER_OTLP_PROTOCOL, then http/protobuf.
	Protocol string `yaml:"protocol"`
	// SampleRatio of the traces started here (parent-based: a sampled parent is always
	// followed). Unset: OTEL_TRACES_SAMPLER/OTEL_TRACES_SAMPLER_ARG, then 0.01
	// (tracing.DefaultSampleRatio).
	SampleRatio *float64 `yaml:"sample_ratio"`
	// ServiceName of the resource. Empty: OTEL_SERVICE_NAME, then gateway.
	ServiceName string `yaml:"service_name"`
	// Headers sent with every export (a collector's auth token, for instance); they add to
	// and override OTEL_EXPORTER_OTLP_HEADERS.
	Headers map[string]string `yaml:"headers"`
	// Insecure sends without TLS (an http:// endpoint is plain anyway).
	Insecure bool `yaml:"insecure"`
	// TrustIncoming continues the trace of an incoming traceparent (default true); false
	// starts a new trace for every request and links it to the incoming context instead,
	// for gateways facing the open internet.
	TrustIncoming *bool `yaml:"trust_incoming"`
}

// Auth configures key checking.
type Auth struct {
	// Mode is prefix (a key of the right family is enough) or registry (the key must be
	// registered, and is limited to its projects or domains).
	Mode string `yaml:"mode"`
	// KeysFile is a YAML list of registered keys (SHA-256 digests, never raw keys), loaded at
	// start and on reload when Redis is not configured.
	KeysFile string `yaml:"keys_file"`
	// CacheTTL bounds how long a replica trusts its cached view of a key when Redis
	// invalidations are lost; revocations normally arrive within a second by pub/sub.
	CacheTTL time.Duration `yaml:"cache_ttl"`
	// FailureLimit is how many failed authentications one client IP (IPv6 per
	// client_ip.ipv6_prefix) may cause in a minute from its first one, counted in process: the
	// upstream's 401s and 403s in both modes, the gateway's own 401s in registry mode. Past it
	// the client gets 429 too_many_auth_failures, its keys are not looked up and nothing of it
	// is forwarded. 0 disables it.
	FailureLimit int `yaml:"failure_limit"`
	// KeyLifetime bounds the expiry of the keys registered or rotated from now on, per kind
	// (registry mode; keys already registered keep theirs).
	KeyLifetime KeyLifetimes `yaml:"key_lifetime"`
	// ExpiryNotice is how long before a key's end (expiry or scheduled revocation) the
	// key.expiring event is sent and the usage page lists the key.
	ExpiryNotice LongDuration `yaml:"expiry_notice"`
}

// KeyLifetimes are the lifetimes of each kind of key.
type KeyLifetimes struct {
	Admin     KeyLifetime `yaml:"admin"`
	Assistant KeyLifetime `yaml:"assistant"`
}

// KeyLifetime is the lifetime of the keys of one kind: Default is the expiry of a key
// registered without one (0: Max, and with no Max the key never expires); Max the latest
// expiry a key may be given (0: no bound).
type KeyLifetime struct {
	Default LongDuration `yaml:"default"`
	Max     LongDuration `yaml:"max"`
}

// TLS names the certificate and key files of the public listener.
type TLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Upstream is the platform API the gateway forwards to.
type Upstream struct {
	URL string `yaml:"url"`
	// Timeout bounds the wait for response headers; a streamed body may run longer.
	Timeout time.Duration `yaml:"timeout"`
	// DialTimeout bounds establishing a connection to the upstream.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// MaxIdleConns is the number of idle keep-alive connections kept to the upstream.
	MaxIdleConns int `yaml:"max_idle_conns"`
	// IdleTimeout closes a keep-alive connection to the upstream once it has been idle this
	// long. It must be below the upstream's own idle timeout (and any load balancer's in
	// between): a request written on a connection the upstream is closing at that moment
	// fails with 502, and is not sent again since it may have been received.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// Transport is "pool", the gateway's own HTTP/1.1 connection pool (package h1) for an
	// http:// upstream, or "standard", net/http's Transport, which an https:// upstream
	// always gets (TLS, and HTTP/2 when the upstream offers it).
	Transport string `yaml:"transport"`
}

// ClientIP says how the client address is derived.
type ClientIP struct {
	// TrustedProxies are CIDRs (or single addresses) whose X-Forwarded-For is believed.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// IPv6Prefix groups IPv6 clients by this prefix length for per-IP limits: one host
	// usually holds a whole /64.
	IPv6Prefix int `yaml:"ipv6_prefix"`
}

// CORS applies to assistant routes only: their keys are public and browsers call them.
type CORS struct {
	// AllowedOrigins lists origins allowed to read assistant responses; "*" allows all.
	AllowedOrigins []string `yaml:"allowed_origins"`
	// MaxAge is how long a browser may cache a preflight answer.
	MaxAge time.Duration `yaml:"max_age"`
}

// Server holds the public listener's protective timeouts and shutdown behaviour.
type Server struct {
	// ReadHeaderTimeout bounds reading request headers (slowloris protection).
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// ReadBodyTimeout is the time a request's body has to arrive, from the request's arrival;
	// it also bounds any wait for a body the gateway does not read.
	ReadBodyTimeout time.Duration `yaml:"read_body_timeout"`
	// IdleTimeout closes keep-alive connections idle this long.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// WriteStallTimeout ends a stream whose client has accepted no byte of it for this long:
	// its slot and hold are settled as for a client that went away, and the upstream
	// connection is closed. 0 turns it off (a client that stops reading then holds its stream
	// for as long as it keeps the connection open).
	WriteStallTimeout time.Duration `yaml:"write_stall_timeout"`
	// MaxHeaderBytes caps the size of request headers; larger ones get 431.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// ShutdownDelay keeps serving (with /readyz at 503) this long after SIGTERM, so load
	// balancers notice before listeners close.
	ShutdownDelay time.Duration `yaml:"shutdown_delay"`
	// ShutdownGrace is how long in-flight requests and streams may run after listeners close.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
}

// Log configures the zap logger.
type Log struct {
	// Level is debug, info, warn or error.
	Level string `yaml:"level"`
	// Format is json (production) or console (readable; also set by -dev).
	Format string `yaml:"format"`
	// Sampling thins repeated lines under load; off by default.
	Sampling Sampling `yaml:"sampling"`
	// Buffer, in bytes, batches log writes (lines then appear up to a second late and are
	// flushed at shutdown); 0 writes every line at once.
	Buffer int `yaml:"buffer"`
}

// Sampling keeps, per second and per message, the first Initial lines and then every
// Thereafter-th. Initial 0 turns sampling off.
type Sampling struct {
	Initial    int `yaml:"initial"`
	Thereafter int `yaml:"thereafter"`
}

// Org is one organization: its assistant domains and, optionally, its plan.
type Org struct {
	Domains []string `yaml:"domains"`
	Plan    string   `yaml:"plan"`
}

// decodeShort takes the short form, a list of domains; the long form {domains, plan} is a
// mapping, which the config decoder reads key by key like any other.
func (o *Org) decodeShort(n *yaml.Node) error {
	if n.Kind != yaml.SequenceNode {
		return fmt.Errorf("want a list of domains or {domains: [...], plan: NAME}")
	}
	for _, item := range n.Content {
		if item.Kind != yaml.ScalarNode {
			return fmt.Errorf("want a list of domains (strings)")
		}
		o.Domains = append(o.Domains, item.Value)
	}
	return nil
}

// Deprecation marks a route deprecated (RFC 9745) with an optional sunset (RFC 8594).
type Deprecation struct {
	// Since is when the route became deprecated: a date (2025-06-01) or RFC 3339 time.
	Since string `yaml:"since"`
	// Sunset is when the route stops working; never earlier than Since.
	Sunset string `yaml:"sunset"`
	// Link points to the migration guide.
	Link string `yaml:"link"`
}

// Route is one entry of routes:. Naming a built-in route (agent_job, assistant_message)
// adjusts it; any other name adds a pass-through route.
type Route struct {
	Name string `yaml:"name"`
	// Method is an HTTP method such as GET or POST.
	Method string `yaml:"method"`
	// Path is a Go ServeMux path pattern with {params}, e.g. /v2/agent/{projectId}/job/{jobId}.
	Path string `yaml:"path"`
	// Key is the key family the route requires: admin or assistant.
	Key string `yaml:"key"`
	// Stream marks routes whose responses are streamed to the client unbuffered.
	Stream *bool `yaml:"stream"`
	// Limits lists the limits the route applies; absent: the built-in routes apply the
	// platform's, others none. Counters belong to the limit, so routes listing the same
	// limit share one quota.
	Limits *[]string `yaml:"limits"`
	// Deprecation adds Deprecation, Sunset and Link headers to the route's responses.
	Deprecation *Deprecation `yaml:"deprecation"`
	// MaxMessages bounds the messages of a body of the assistant routes (assistant_message,
	// assistant_message_v2); absent: DefaultMaxMessages; 0: no bound but max_body_bytes.
	MaxMessages *int `yaml:"max_messages"`
	// MaxPartsPerMessage bounds the parts of each message of an assistant route's body;
	// absent: DefaultMaxPartsPerMessage; 0: no bound but max_body_bytes.
	MaxPartsPerMessage *int `yaml:"max_parts_per_message"`
	// ForwardAuthOnly serves the route through the forward-auth door alone (forward_auth):
	// the public listener answers 404 for it. Such a route may apply request limits only:
	// body checks, tokens limits and streams limits need the body or the answer, which a
	// proxy asking the door never shows the gateway.
	ForwardAuthOnly bool `yaml:"forward_auth_only"`
}

// The conversation bounds of the assistant routes when their entries set none: far beyond a
// real chat (a client resends the whole conversation each turn, and an AI SDK 5 answer of
// many tool steps with their sources holds a few dozen parts), far below what a body of
// max_body_bytes can pack (a 1 MiB body holds 30,000 empty messages), so a client cannot make
// the upstream walk a conversation no chat has.
const (
	DefaultMaxMessages        = 1000
	DefaultMaxPartsPerMessage = 500
)

// Quota configures run-time quota changes.
type Quota struct {
	// AuditMax is how many audit entries are kept (the newest): in Redis, or in process for
	// the in-process store.
	AuditMax int `yaml:"audit_max"`
}

// MaxAuditMax bounds quota.audit_max: entries are a few hundred bytes each, kept in Redis'
// memory (or the gateway's).
const MaxAuditMax = 10_000_000

// Defaults returns the configuration every omitted key falls back to.
func Defaults() Config {
	return Config{
		Listen:          ":8080",
		AdminListen:     "127.0.0.1:9090",
		AdminUIRefresh:  10 * time.Second,
		AdminMaxExports: 2,
		MaxBodyBytes:    1 << 20,
		Upstream: Upstream{
			Timeout:      30 * time.Second,
			DialTimeout:  5 * time.Second,
			MaxIdleConns: 512,
			// Below the 60 s idle timeout of the common load balancers (AWS's ALB and ELB
			// among them) and nginx's 75 s: none of them closes a connection the gateway
			// still counts on. Upstreams with shorter timeouts (Node's 5 s) need a lower value.
			IdleTimeout: 50 * time.Second,
			Transport:   "pool",
		},
		CORS: CORS{
			AllowedOrigins: []string{"*"},
			MaxAge:         10 * time.Minute,
		},
		Server: Server{
			ReadHeaderTimeout: 10 * time.Second,
			ReadBodyTimeout:   30 * time.Second,
			IdleTimeout:       120 * time.Second,
			// Far longer than a healthy client's pauses: the kernel's buffers (hundreds of KiB
			// between the two ends) absorb a radio handover or a busy tab, so a write blocks only
			// once they are full, and a few TCP retransmissions fit in 10 s. Short enough that a
			// client that stops reading frees its slot in seconds, not at reserve_ttl.
			WriteStallTimeout: 10 * time.Second,
			MaxHeaderBytes:    64 << 10,
			ShutdownGrace:     30 * time.Second,
		},
		Log:      Log{Level: "info", Format: "json"},
		Auth:     Auth{Mode: "prefix", CacheTTL: 10 * time.Second, FailureLimit: 30, ExpiryNotice: LongDuration(7 * 24 * time.Hour)},
		ClientIP: ClientIP{IPv6Prefix: 64},
		Redis: Redis{
			Timeout:   100 * time.Millisecond,
			OnError:   "deny",
			KeyPrefix: "gw",
			Breaker:   Breaker{Failures: 5, Cooldown: time.Second},
			Coalesce:  true,
		},
		Quota:         Quota{AuditMax: 100_000},
		SelfUsage:     selfUsageDefaults,
		Notifications: notificationDefaults,
		ForwardAuth:   forwardAuthDefaults(),
	}
}
