package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// clientAt is an HTTP client whose connections leave from the loopback address local
// (127.0.0.0/8 is all this host's), so that the gateway sees another client address.
func clientAt(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
}

// selfRead asks p's usage endpoint from c with key and returns what came back, whatever it is.
func selfRead(t *testing.T, c *http.Client, p *proc, query, key string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+p.public+"/gateway/usage?"+query, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(data)
}

// limitNames are the names of an answer's limits, sorted.
func limitNames(t *testing.T, body string) []string {
	t.Helper()
	var a selfAnswer
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	var names []string
	for _, l := range a.Limits {
		names = append(names, l.Name)
	}
	slices.Sort(names)
	return names
}

const prefixExposureConfig = `admin_token: %q
orgs:
  acme: {domains: [acme-docs, acme-blog], plan: enterprise}
  globex: [globex-docs]
plans:
  enterprise:
    assistant_per_org: {limit: 50000}
    assistant_per_key: {limit: 100000}
limits:
  assistant_per_org: {limit: 50, window: hour}
  assistant_per_ip: {limit: 1000, window: day}
  assistant_tokens_per_ip: {limit: 5000, window: day, by: ip, unit: tokens}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_ip]
` + reloadMarker + "%s"

// In prefix mode (the default auth.mode) the gateway cannot tell a real key from an invented
// one. As filed, against two replicas on one Redis: any well-formed invented key read any org's
// and any project's counters, its plan's limits (an enterprise plan) and which domains share
// an org. By default the endpoint now shows only what the caller's own address counts (the
// limits by ip); self_usage.prefix_mode_exposes opts in to more, with a warning at start that
// names what it exposes.
func TestSelfUsagePrefixModeShowsOnlyTheCallersAddress(t *testing.T) {
	t.Parallel()
	const (
		tenantKey = "svc_dsc_prefixacme0123456789abcdef" // acme's real (public) assistant key
		adminKey  = "svc_prefixacmeadmin0123456789abcd"  // acme's real admin key
	)
	up := newGatedUpstream(t)
	store := fmt.Sprintf("redis: {addrs: [%q], timeout: %s}\n", redistest.Start(t).Addr, exactTimeout)
	var ps []*proc
	for range 2 {
		ps = append(ps, startGateway(t, up.url, store+fmt.Sprintf(prefixExposureConfig, adminToken, "")))
	}
	counter, reader := ps[0], ps[1]
	for _, p := range ps {
		if strings.Contains(p.out.String(), "prefix_mode_exposes") {
			t.Fatalf("a warning about exposure with the defaults:\n%s", p.out.String())
		}
	}

	// acme's visitors (all from 127.0.0.1 here) get three answers of 100 tokens each, and
	// acme's backend runs two jobs on its project p1.
	heldAnswers(t, up, counter, tenantKey, "acme-docs", 3)()
	for range 2 {
		if res := send(t, counter, "POST", "/v2/agent/p1/job", adminKey, `{"prompt":"x","fp":"status-201"}`); res.StatusCode != 201 {
			t.Fatalf("agent job: %d", res.StatusCode)
		}
	}
	waitIPTokens(t, counter, "127.0.0.1", 300)

	// Someone else, at another address, with invented keys of both families.
	attacker := clientAt("127.0.0.2")
	for _, c := range []struct{ query, key string }{
		{"route=assistant_message&domain=acme-docs", "svc_dsc_x"},
		{"route=assistant_message&domain=acme-blog", "svc_dsc_x"},
		{"route=assistant_message&domain=acme-docs", tenantKey}, // acme's key is public: its pages embed it
		{"route=assistant_message&domain=globex-docs", "svc_dsc_y"},
	} {
		status, _, body := selfRead(t, attacker, reader, c.query, c.key)
		if status != 200 {
			t.Fatalf("%s: %d %s", c.query, status, body)
		}
		if got := limitNames(t, body); !slices.Equal(got, []string{"assistant_per_ip", "assistant_tokens_per_ip"}) {
			t.Errorf("%s with %.12s from another address shows %v, want only the limits by ip: %s", c.query, c.key, got, body)
		}
		for _, leak := range []string{`"used":3,`, `"used":300,`, "50000", "100000"} {
			if strings.Contains(body, leak) {
				t.Errorf("%s with %.12s from another address shows %s: %s", c.query, c.key, leak, body)
			}
		}
	}
	status, _, body := selfRead(t, attacker, reader, "route=agent_job&projectId=p1", "svc_x")
	if status != 200 || len(limitNames(t, body)) != 0 {
		t.Errorf("another address with an invented admin key reads project p1: %d %s", status, body)
	}

	// The visitors' own address reads its own counts, through the other replica.
	status, _, body = selfRead(t, http.DefaultClient, reader, "route=assistant_message&domain=acme-docs", tenantKey)
	var own selfAnswer
	if err := json.Unmarshal([]byte(body), &own); status != 200 || err != nil || len(own.Limits) != 2 {
		t.Fatalf("the caller's own address: %d %s", status, body)
	}
	if ip, tok := own.limit(t, "assistant_per_ip"), own.limit(t, "assistant_tokens_per_ip"); ip.Used != 3 || ip.Limit != 1000 || tok.Used != 300 || tok.Remaining != 4700 {
		t.Errorf("the caller's own address: %s", body)
	}

	// The operator opts in: a replica on the same Redis exposes the rest, and says so at start.
	open := startGateway(t, up.url, store+fmt.Sprintf(prefixExposureConfig, adminToken,
		"self_usage: {prefix_mode_exposes: [key, org, project]}\n"))
	warning := regexp.MustCompile(`"level":"warn".*self_usage\.prefix_mode_exposes.*any org's counters.*any project's counters`)
	if !warning.MatchString(open.out.String()) {
		t.Errorf("no warning at start naming what is exposed:\n%s", open.out.String())
	}
	status, _, body = selfRead(t, attacker, open, "route=assistant_message&domain=acme-blog", "svc_dsc_x")
	var all selfAnswer
	if err := json.Unmarshal([]byte(body), &all); status != 200 || err != nil || len(all.Limits) != 4 {
		t.Fatalf("opted in: %d %s", status, body)
	}
	if o := all.limit(t, "assistant_per_org"); o.Used != 3 || o.Limit != 50000 {
		t.Errorf("opted in, the org's counter: %s", body)
	}
	status, _, body = selfRead(t, attacker, open, "route=agent_job&projectId=p1", "svc_x")
	if a := (selfAnswer{}); status != 200 || json.Unmarshal([]byte(body), &a) != nil || a.limit(t, "agent_job_per_project").Used != 2 {
		t.Errorf("opted in, the project's counter: %d %s", status, body)
	}

	// By reload, in and out: the warning when it starts exposing, the answers following.
	orgsOnly := regexp.MustCompile(`"level":"warn".*self_usage\.prefix_mode_exposes.*any org's counters`)
	reloadConfig(t, reader, "self_usage: {prefix_mode_exposes: [org]}\n")
	// The process wrote its warning before it answered the reload; the copy of its output
	// into the test's buffer may still be on the way.
	for deadline := time.Now().Add(10 * time.Second); !orgsOnly.MatchString(reader.out.String()) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if !orgsOnly.MatchString(reader.out.String()) || strings.Contains(reader.out.String(), "any project's counters") {
		t.Errorf("no warning, or the wrong one, after a reload that exposes the orgs:\n%s", reader.out.String())
	}
	status, _, body = selfRead(t, attacker, reader, "route=assistant_message&domain=acme-docs", "svc_dsc_x")
	if got := limitNames(t, body); status != 200 || !slices.Equal(got, []string{"assistant_per_ip", "assistant_per_org", "assistant_tokens_per_ip"}) {
		t.Errorf("after the reload that exposes the orgs: %d %s", status, body)
	}
	reloadConfig(t, reader, "")
	status, _, body = selfRead(t, attacker, reader, "route=assistant_message&domain=acme-docs", "svc_dsc_x")
	if got := limitNames(t, body); status != 200 || !slices.Equal(got, []string{"assistant_per_ip", "assistant_tokens_per_ip"}) {
		t.Errorf("after the reload back to the default: %d %s", status, body)
	}
}

// waitIPTokens polls the admin listener until the address's assistant_tokens_per_ip reads
// used (an answer's tokens are debited once it ends).
func waitIPTokens(t *testing.T, p *proc, ip string, used int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := adminGet(t, p, "/usage/ips/"+ip, adminToken)
		var u selfAnswer
		if code == 200 && json.Unmarshal([]byte(body), &u) == nil {
			for _, l := range u.Limits {
				if l.Name == "assistant_tokens_per_ip" && l.Used == used {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d %s, want assistant_tokens_per_ip used %d", ip, code, body, used)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// usageRefusal is a 429 of the endpoint's own bound.
type usageRefusal struct {
	Error      string `json:"error"`
	Code       string `json:"code"`
	Limit      string `json:"limit"`
	RetryAfter int64  `json:"retry_after"`
}

// boundRefusal checks that status, h and body are the endpoint's own 429 whose message
// contains cause.
func boundRefusal(t *testing.T, status int, h http.Header, body, cause string) {
	t.Helper()
	var r usageRefusal
	if status != 429 || json.Unmarshal([]byte(body), &r) != nil {
		t.Fatalf("want the endpoint's 429: %d %s", status, body)
	}
	retry, err := strconv.ParseInt(h.Get("Retry-After"), 10, 64)
	if r.Code != "rate_limited" || r.Limit != "self_usage" || err != nil || retry < 1 || retry > 60 || r.RetryAfter != retry {
		t.Fatalf("429: %v %s", h, body)
	}
	if !strings.Contains(r.Error, cause) {
		t.Fatalf("the 429 says %q, want the cause %q", r.Error, cause)
	}
}

// untilRefused reads with key(i) from c until the first refusal and returns how many were
// answered 200 before it, failing past most.
func untilRefused(t *testing.T, c *http.Client, p *proc, key func(i int) string, most int) (int, int, http.Header, string) {
	t.Helper()
	for i := 0; ; i++ {
		status, h, body := selfRead(t, c, p, "route=assistant_message&domain=acme-docs", key(i))
		if status != 200 {
			return i, status, h, body
		}
		if i == most {
			t.Fatalf("%d reads answered and none refused: %s", i+1, body)
		}
	}
}

// As filed: invented keys (65,536 at ~2,000/s) filled the per-key bound's table, and for the
// rest of the minute every real key got 429 "Too many usage requests for this key". Now the
// bound counts per client address first, with the defaults (120 answers per address and 60
// per key a minute): invented keys from one address stop there, a real key elsewhere is still
// answered, and each 429 names its cause.
func TestSelfUsageInventedKeysStopAtTheirAddress(t *testing.T) {
	t.Parallel()
	p := startGateway(t, "http://127.0.0.1:1", "orgs: {acme: [acme-docs]}\n")
	const perAddress, perKey = 120, 60

	// The flood as filed: a fresh invented key per read, until the gateway refuses one (the
	// old per-key table refused only once it held 65,536 keys).
	start := time.Now()
	attacker := clientAt("127.0.0.2")
	answered, status, h, body := untilRefused(t, attacker, p, func(i int) string { return fmt.Sprintf("svc_dsc_invented%08d", i) }, 4<<16)
	// Each address's minute runs from its first answer: on a machine so slow that the reads
	// took longer, a second minute began.
	if answered != perAddress && !(time.Since(start) > time.Minute && answered > perAddress) {
		t.Errorf("%d invented keys answered from one address, want %d; then %d %s", answered, perAddress, status, body)
	}
	// A real key at another address is answered; at the attacker's address the cause is the address.
	if status, _, body := selfRead(t, http.DefaultClient, p, "route=assistant_message&domain=acme-docs", "svc_dsc_realwidget0123456789abcd"); status != 200 {
		t.Fatalf("a real key at another address after the flood: %d %s", status, body)
	}
	boundRefusal(t, status, h, body, "from this address")
	status, h, body = selfRead(t, attacker, p, "route=assistant_message&domain=acme-docs", "svc_dsc_realwidget0123456789abcd")
	boundRefusal(t, status, h, body, "from this address")

	// The per-key bound still holds, across addresses, and says so.
	const busyKey = "svc_dsc_busywidget0123456789abcde"
	start = time.Now()
	answered, status, h, body = untilRefused(t, clientAt("127.0.0.3"), p, func(int) string { return busyKey }, 2*perKey)
	boundRefusal(t, status, h, body, "for this key")
	if answered != perKey && !(time.Since(start) > time.Minute && answered > perKey) {
		t.Fatalf("%d answers for one key, want %d", answered, perKey)
	}
	status, h, body = selfRead(t, clientAt("127.0.0.4"), p, "route=assistant_message&domain=acme-docs", busyKey)
	boundRefusal(t, status, h, body, "for this key")
	if status, _, body := selfRead(t, clientAt("127.0.0.3"), p, "route=assistant_message&domain=acme-docs", "svc_dsc_otherwidget0123456789abc"); status != 200 {
		t.Fatalf("another key at the busy key's address: %d %s", status, body)
	}
}
