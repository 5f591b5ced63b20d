package main

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/admin"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/policy"
)

// startWarnings are the warnings a start with cfg logs, and -check-config prints: what the
// config defines that nothing applies (policy.Unused), what it exposes (the admin listener,
// the tenants' usage endpoint, webhooks to private addresses), the in-process store, and a
// keys file without keys. Each is one line, secrets masked. A keys file that cannot be read
// is no warning: the start refuses it (newRegistry), and so does -check-config.
func startWarnings(cfg *config.Config) []string {
	var out []string
	for _, p := range policy.Unused(cfg) {
		out = append(out, p.String())
	}
	if msg := adminExposure(cfg); msg != "" {
		out = append(out, msg)
	}
	if msg := selfUsageExposure(cfg); msg != "" {
		out = append(out, msg)
	}
	out = append(out, privateWebhooks(cfg)...)
	if len(cfg.Redis.Addrs) == 0 {
		out = append(out, "redis.addrs is empty: limits are counted in this process only, so each replica admits its own quota; configure Redis when running more than one replica")
	}
	if keysFileOnly(cfg) {
		if entries, err := loadKeysFile(cfg.Auth.KeysFile); err == nil && len(entries) == 0 {
			out = append(out, "auth.keys_file "+cfg.Auth.KeysFile+" holds no keys yet: every request is refused until keys are added")
		}
	}
	for i, msg := range out {
		out[i] = config.Redact(msg, cfg.Secrets()...)
	}
	return out
}

// logWarnings logs each warning once.
func logWarnings(log *zap.Logger, warnings []string) {
	for _, w := range warnings {
		log.Warn(w)
	}
}

// keysFileOnly says whether the key registry is auth.keys_file: registry mode without Redis.
func keysFileOnly(cfg *config.Config) bool {
	return cfg.Auth.Mode == "registry" && len(cfg.Redis.Addrs) == 0 && cfg.Auth.KeysFile != ""
}

// adminExposure is the warning for an admin listener that accepts connections from other
// hosts without a token: who can reach what; "" when it has a token or listens on loopback.
func adminExposure(cfg *config.Config) string {
	if cfg.AdminToken != "" || admin.IsLoopbackListen(cfg.AdminListen) {
		return ""
	}
	return "admin_listen accepts connections from other hosts and admin_token is empty: anyone who can reach " +
		cfg.AdminListen + " can read /metrics, the usage endpoints and page (tenants' usage) and /debug/pprof; " +
		"key and reload writes are refused (403 admin_token_required) until admin_token (GATEWAY_ADMIN_TOKEN) is set. " +
		"Set admin_token, or restrict the port with a network policy."
}

// privateWebhooks are the warnings for webhook endpoints that may be delivered to loopback,
// link-local, private and metadata addresses: the opt-in is the operator's, and should be seen.
func privateWebhooks(cfg *config.Config) []string {
	var out []string
	for i, w := range cfg.Notifications.Webhooks {
		if w.AllowPrivateAddresses {
			out = append(out, fmt.Sprintf("notifications.webhooks[%d].allow_private_addresses is set (endpoint %s): deliveries to this endpoint may connect to loopback, link-local, private and cloud metadata addresses; set it only for a receiver of yours there", i, w.Name))
		}
	}
	return out
}
