package config

import (
	"encoding/base64"
	"fmt"
	"io"
	"maps"
	"math"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/docsgate/gateway/internal/netguard"
)

// Notifications configures signed webhooks (Standard Webhooks 1.0) on quota events. Without
// webhooks nothing is detected or sent.
type Notifications struct {
	// Webhooks are the endpoints events are delivered to, each with its own secret.
	Webhooks []Webhook `yaml:"webhooks"`
	// Timeout bounds one delivery attempt, response included.
	Timeout time.Duration `yaml:"timeout"`
	// MaxBackoff caps the wait between attempts: it starts at 1 s and doubles, with jitter.
	MaxBackoff time.Duration `yaml:"max_backoff"`
	// RetryFor is how long an event is retried from its detection; then it is a dead letter.
	RetryFor time.Duration `yaml:"retry_for"`
}

// Webhook is one endpoint of notifications.webhooks.
type Webhook struct {
	// Name identifies the endpoint in metrics, logs, the admin API and the test command.
	Name string `yaml:"name"`
	// URL receives the events as POST requests: http:// or https://, a public address
	// unless AllowPrivateAddresses.
	URL string `yaml:"url"`
	// AllowPrivateAddresses lets deliveries reach loopback, link-local, private and metadata
	// addresses (a relay on the same host or network). Off (the default), a connection to
	// one is refused after DNS, and a URL naming one literally is refused here: a mistyped or
	// malicious URL must not make the gateway post to the cloud metadata service or an
	// internal service. Setting it is warned about at start.
	AllowPrivateAddresses bool `yaml:"allow_private_addresses"`
	// Secret, SecretFile and SecretEnv: exactly one gives the signing secret, whsec_ and the
	// base64 of 24 to 64 random bytes. Several secrets separated by spaces or new lines each
	// sign every delivery (a rotation: the receiver accepts any of them).
	Secret     string `yaml:"secret"`
	SecretFile string `yaml:"secret_file"`
	SecretEnv  string `yaml:"secret_env"`
	// Events lists the event types sent to the endpoint; absent: all.
	Events []string `yaml:"events"`
	// Limits lists the limits whose events are sent to the endpoint; absent: all.
	Limits []string `yaml:"limits"`

	// Keys are the decoded signing secrets, set by Load from whichever source the file names.
	// Never printed.
	Keys [][]byte `yaml:"-"`
}

// Event types a webhook can subscribe to. EventPing is sent only on request (the test
// command), to the one endpoint named.
const (
	EventThresholdCrossed = "quota.threshold_crossed"
	EventExhausted        = "quota.exhausted"
	EventForecast         = "quota.forecast"
	EventOverrideExpired  = "quota.override_expired"
	EventKeyRevoked       = "key.revoked"
	EventKeyRotated       = "key.rotated"
	EventKeyExpiring      = "key.expiring"
	EventPing             = "ping"
)

// EventTypes are the types an endpoint's events: may list.
var EventTypes = []string{EventThresholdCrossed, EventExhausted, EventForecast, EventOverrideExpired, EventKeyRevoked,
	EventKeyRotated, EventKeyExpiring}

// QuotaEventTypes are the events a limit's counters detect, those a limit's events: may list.
var QuotaEventTypes = []string{EventThresholdCrossed, EventExhausted, EventForecast}

// MaxThresholds bounds the thresholds of one limit: each is a mark in the tenant's counter.
const MaxThresholds = 8

// DefaultThresholds are a limit's thresholds when notifications are on and it sets none.
var DefaultThresholds = []float64{0.8, 1.0}

// SecretPrefix starts every signing secret (Standard Webhooks' serialization).
const SecretPrefix = "whsec_"

// Secret sizes, in bytes, that Standard Webhooks allows for HMAC-SHA256 (192 to 512 bits).
const (
	minSecretBytes = 24
	maxSecretBytes = 64
)

var notificationDefaults = Notifications{Timeout: 5 * time.Second, MaxBackoff: 5 * time.Minute, RetryFor: 24 * time.Hour}

// Enabled tells whether any webhook is configured.
func (n *Notifications) Enabled() bool { return len(n.Webhooks) > 0 }

// Wants says whether some endpoint takes events of type event about limit ("": any limit,
// or an event of none): the limits mark only what is sent somewhere.
func (n *Notifications) Wants(event, limit string) bool {
	for _, w := range n.Webhooks {
		if (w.Events == nil || slices.Contains(w.Events, event)) && (w.Limits == nil || limit == "" || slices.Contains(w.Limits, limit)) {
			return true
		}
	}
	return false
}

// ParseSecrets decodes one or more signing secrets separated by white space. Its errors never
// quote the text: it is a secret.
func ParseSecrets(s string) ([][]byte, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return nil, fmt.Errorf("is empty")
	}
	keys := make([][]byte, 0, len(fields))
	for i, f := range fields {
		rest, ok := strings.CutPrefix(f, SecretPrefix)
		if !ok {
			return nil, fmt.Errorf("secret %d of %d does not start with %s", i+1, len(fields), SecretPrefix)
		}
		key, err := base64.StdEncoding.DecodeString(rest)
		if err != nil {
			return nil, fmt.Errorf("secret %d of %d is not %s followed by standard base64", i+1, len(fields), SecretPrefix)
		}
		if len(key) < minSecretBytes || len(key) > maxSecretBytes {
			return nil, fmt.Errorf("secret %d of %d holds %d bytes: want %d to %d random bytes", i+1, len(fields), len(key), minSecretBytes, maxSecretBytes)
		}
		keys = append(keys, key)
	}
	return keys, nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// notifications checks the notifications block and, on limits and plans, thresholds and
// forecast. Secrets given inline are checked here; secret_file and secret_env are read by
// resolveSecrets once the rest is valid.
func (v *validator) notifications(c *Config) {
	n := &c.Notifications
	v.positive("notifications.timeout", n.Timeout)
	if n.MaxBackoff < time.Second {
		v.fail("notifications.max_backoff", "%s: must be at least 1s (the first wait)", n.MaxBackoff)
	}
	v.positive("notifications.retry_for", n.RetryFor)
	names := map[string]bool{}
	for _, s := range c.ResolvedLimits() {
		names[s.Name] = true
	}
	seen := map[string]bool{}
	for i, w := range n.Webhooks {
		key := indexKey("notifications.webhooks", i)
		switch {
		case !routeName.MatchString(w.Name):
			v.fail(key+".name", "%q must be lower_snake_case (it becomes a metric label)", w.Name)
		case seen[w.Name]:
			v.fail(key+".name", "%q is used by another webhook", w.Name)
		}
		seen[w.Name] = true
		v.webhookURL(key+".url", w.URL, w.AllowPrivateAddresses)
		sources := 0
		for _, s := range []string{w.Secret, w.SecretFile, w.SecretEnv} {
			if s != "" {
				sources++
			}
		}
		if sources != 1 {
			v.fail(key, "needs exactly one of secret, secret_file and secret_env (%d set)", sources)
		}
		if w.Secret != "" {
			if _, err := ParseSecrets(w.Secret); err != nil {
				v.fail(key+".secret", "%v", err)
			}
		}
		if w.SecretEnv != "" && !envName.MatchString(w.SecretEnv) {
			v.fail(key+".secret_env", "%q is not an environment variable name", w.SecretEnv)
		}
		if w.Events != nil && len(w.Events) == 0 {
			v.fail(key+".events", "is empty: list event types, or leave it out for all")
		}
		for j, e := range w.Events {
			ek := indexKey(key+".events", j)
			switch {
			case e == EventPing:
				v.fail(ek, "ping is sent only by the test command, to the endpoint it names")
			case !slices.Contains(EventTypes, e):
				v.fail(ek, "%q is not one of %s", e, strings.Join(EventTypes, ", "))
			case slices.Index(w.Events, e) < j:
				v.fail(ek, "%q is listed twice", e)
			}
		}
		if w.Limits != nil && len(w.Limits) == 0 {
			v.fail(key+".limits", "is empty: list limits, or leave it out for all")
		}
		for j, l := range w.Limits {
			lk := indexKey(key+".limits", j)
			switch {
			case !names[l]:
				v.fail(lk, "%q is not a defined limit%s", l, Suggest(l, slices.Sorted(maps.Keys(names))))
			case slices.Index(w.Limits, l) < j:
				v.fail(lk, "%q is listed twice", l)
			}
		}
	}

	check := func(key string, l Limit, s LimitSpec) {
		if l.Thresholds != nil {
			if !n.Enabled() {
				v.fail(key+".thresholds", "has no effect without notifications.webhooks")
			}
			ts := *l.Thresholds
			if len(ts) > MaxThresholds {
				v.fail(key+".thresholds", "lists %d: at most %d", len(ts), MaxThresholds)
			}
			// In millionths, as the counters keep them: 0.8 and 0.8000001 are one threshold.
			ppm := func(t float64) float64 { return math.Round(t * 1e6) }
			for i, t := range ts {
				if !(t > 0 && t <= 1) || ppm(t) == 0 {
					v.fail(indexKey(key+".thresholds", i), "%g is not a fraction of the limit in (0, 1] (to a millionth)", t)
				} else if i > 0 && ppm(t) <= ppm(ts[i-1]) {
					v.fail(indexKey(key+".thresholds", i), "%g: thresholds are listed in increasing order, each once (to a millionth)", t)
				}
			}
			if len(ts) > 0 && !windowed(s) {
				v.fail(key+".thresholds", "only a fixed-window requests or tokens limit crosses thresholds (%s)", describeLimit(s))
			}
		}
		if l.Forecast != nil && *l.Forecast {
			if !n.Enabled() {
				v.fail(key+".forecast", "has no effect without notifications.webhooks")
			}
			if !windowed(s) {
				v.fail(key+".forecast", "only a fixed-window requests or tokens limit has a burn rate to forecast (%s)", describeLimit(s))
			}
		}
		v.limitEvents(key, l, s, n.Enabled())
	}
	base := map[string]LimitSpec{}
	for _, s := range c.ResolvedLimits() {
		base[s.Name] = s
	}
	for name, l := range c.Limits {
		check("limits."+name, l, base[name])
	}
	for plan, overrides := range c.Plans {
		specs := map[string]LimitSpec{}
		for _, s := range c.PlanLimits(plan) {
			specs[s.Name] = s
		}
		for name, l := range overrides {
			if s, ok := specs[name]; ok {
				check("plans."+plan+"."+name, l, s)
			}
		}
	}
}

// limitEvents checks a limit's (or a plan entry's) events against the resolved spec s: known
// quota events, each once, and nothing set that would never be sent.
func (v *validator) limitEvents(key string, l Limit, s LimitSpec, enabled bool) {
	if l.Events != nil {
		if !enabled {
			v.fail(key+".events", "has no effect without notifications.webhooks")
		}
		for j, e := range *l.Events {
			ek := indexKey(key+".events", j)
			switch {
			case !slices.Contains(QuotaEventTypes, e):
				v.fail(ek, "%q is not one of %s", e, strings.Join(QuotaEventTypes, ", "))
			case slices.Index(*l.Events, e) < j:
				v.fail(ek, "%q is listed twice", e)
			case !windowed(s):
				v.fail(ek, "only a fixed-window requests or tokens limit sends quota events (%s)", describeLimit(s))
			case enabled && e == EventForecast && !s.Forecast:
				v.fail(ek, "quota.forecast is sent only with forecast: true")
			case enabled && e == EventThresholdCrossed && len(s.Thresholds) == 0:
				v.fail(ek, "quota.threshold_crossed needs thresholds (the limit's are [])")
			}
		}
	}
	if !enabled || !windowed(s) {
		return // reported above
	}
	// A threshold or forecast set in this entry that the limit's events leave out would never
	// be sent: the operator meant one or the other.
	if l.Thresholds != nil && len(*l.Thresholds) > 0 && !s.Sends(EventThresholdCrossed) {
		v.fail(key+".thresholds", "are never sent: the limit's events do not list %s", EventThresholdCrossed)
	}
	if l.Forecast != nil && *l.Forecast && !s.Sends(EventForecast) {
		v.fail(key+".forecast", "is never sent: the limit's events do not list %s", EventForecast)
	}
}

// windowed tells whether s counts in fixed windows, where thresholds and forecasts apply.
func windowed(s LimitSpec) bool {
	return s.Unit != "streams" && (s.Algorithm == "" || s.Algorithm == "fixed")
}

func describeLimit(s LimitSpec) string {
	if s.Unit == "streams" {
		return "a streams limit counts answers in flight"
	}
	return "a " + s.Algorithm + " limit has no windows"
}

// webhookURL checks an endpoint's URL: http or https, and an address that is public unless
// allowPrivate (a host name is checked when a delivery connects, after DNS). Its messages
// never quote the URL: a path or query may carry a token (as chat webhooks' do).
func (v *validator) webhookURL(key, raw string, allowPrivate bool) {
	u, err := url.Parse(raw)
	switch {
	case raw == "":
		v.fail(key, "is required")
	case err != nil:
		v.fail(key, "is not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		v.fail(key, "must start with http:// or https://")
	case u.Host == "" || u.Hostname() == "":
		v.fail(key, "has no host")
	case u.User != nil:
		v.fail(key, "must not carry credentials: deliveries are authenticated by their signature")
	case u.Fragment != "":
		v.fail(key, "must not have a fragment")
	case !allowPrivate:
		if a, err := netip.ParseAddr(u.Hostname()); err == nil {
			if kind := netguard.Classify(a); kind != "" {
				v.fail(key, "%s is %s address: deliveries to loopback, link-local, private and metadata addresses are refused; set allow_private_addresses: true on this endpoint if the receiver is yours", a.WithZone(""), netguard.Article(kind))
			}
		}
	}
}

// resolveSecrets reads every webhook's signing secrets from the source it names. Problems
// name the source, never its content.
func resolveSecrets(c *Config, env Env, readFile func(string) ([]byte, error)) []Problem {
	var problems []Problem
	for i := range c.Notifications.Webhooks {
		w := &c.Notifications.Webhooks[i]
		key := indexKey("notifications.webhooks", i)
		var text string
		switch {
		case w.Secret != "":
			key, text = key+".secret", w.Secret
		case w.SecretFile != "":
			key += ".secret_file"
			data, err := readFile(w.SecretFile)
			if err != nil {
				problems = append(problems, Problem{Key: key, Msg: fmt.Sprintf("cannot read %s: %v", w.SecretFile, errCause(err))})
				continue
			}
			text = string(data)
		case w.SecretEnv != "":
			key += ".secret_env"
			var ok bool
			if env != nil {
				text, ok = env(w.SecretEnv)
			}
			if !ok || strings.TrimSpace(text) == "" {
				problems = append(problems, Problem{Key: key, Msg: fmt.Sprintf("the environment variable %s is not set", w.SecretEnv)})
				continue
			}
		default:
			continue // reported by Validate
		}
		keys, err := ParseSecrets(text)
		if err != nil {
			problems = append(problems, Problem{Key: key, Msg: err.Error()})
			continue
		}
		w.Keys = keys
	}
	return problems
}

// maxSecretFile bounds what is read of a secret_file: a few secrets take a few hundred bytes.
const maxSecretFile = 64 << 10

// readSecretFile reads a secret_file, refusing one larger than maxSecretFile.
func readSecretFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxSecretFile {
		return nil, fmt.Errorf("larger than %d KiB", maxSecretFile>>10)
	}
	return data, nil
}

// errCause is a file error without the path it repeats.
func errCause(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}
