package main

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/codingtest"
)

// browserAccepts is the Accept-Encoding a browser's fetch sends (a page cannot change it).
var browserAccepts = http.Header{"Accept-Encoding": {"gzip, deflate, br, zstd"}}

// answerCodings are the codings the tests' upstreams put on an answer whatever the request
// asked for, as an upstream, CDN or ingress that compresses regardless does.
var answerCodings = codingtest.Codings()

// codingUpstream is the cut upstream (newCutUpstream) whose answers are content-coded as
// their domain's first word says ("gzip-v1-docs": gzip), flushed part by part as a
// compressing server that streams does (a sync flush after each part). It records the
// Accept-Encoding of every request. Agent jobs get {"jobId":"job_1"} in gzip when their
// request accepts it, as any server that compresses by negotiation.
type codingUpstream struct {
	*cutUpstream
	mu       sync.Mutex
	accepted []string
}

func newCodingUpstream(t *testing.T) *codingUpstream {
	c := &codingUpstream{}
	c.cutUpstream = newCutUpstreamWrapped(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ae := r.Header.Get("Accept-Encoding")
			c.mu.Lock()
			c.accepted = append(c.accepted, ae)
			c.mu.Unlock()
			if strings.HasPrefix(r.URL.Path, "/v2/agent/") {
				io.Copy(io.Discard, r.Body)
				if !strings.Contains(ae, "gzip") {
					w.WriteHeader(201)
					io.WriteString(w, `{"jobId":"job_1"}`)
					return
				}
				w.Header().Set("Content-Encoding", "gzip")
				w.WriteHeader(201)
				z := gzip.NewWriter(w)
				io.WriteString(z, `{"jobId":"job_1"}`)
				z.Close()
				return
			}
			segs := strings.Split(r.URL.Path, "/") // "", discovery, v1, assistant, domain, message
			coding, _, _ := strings.Cut(segs[4], "-")
			cw := codingtest.NewWriter(w, coding)
			h.ServeHTTP(cw, r)
			cw.Close()
		})
	})
	return c
}

// acceptedAll returns the Accept-Encoding of the requests so far.
func (c *codingUpstream) acceptedAll() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.accepted)
}

const codingConfig = `limits:
  assistant_tokens_per_org: {limit: 2000, window: month, by: org, unit: tokens, reserve: 100, cutoff: true}
routes:
  - name: assistant_message
    limits: [assistant_tokens_per_org]
  - name: assistant_message_v2
    limits: [assistant_tokens_per_org]
`

// codingOrgs maps an org per coding and route version ("gzip-v1") to its domain.
func codingOrgs() string {
	var b strings.Builder
	b.WriteString("orgs: {")
	for _, c := range slices.Sorted(mapKeys(answerCodings)) {
		for _, v := range []string{"v1", "v2"} {
			fmt.Fprintf(&b, "%s-%s: [%s-%s-docs], ", c, v, c, v)
		}
	}
	return strings.TrimSuffix(b.String(), ", ") + "}\n"
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// The reproduction: with a tokens limit of 2,000 (reserve 100, cutoff), eight answers
// of 1,006 tokens asked with a browser's Accept-Encoding, from an upstream that codes them
// whatever it is asked, on v1 and v2, in every coding, over both upstream transports. The
// gateway asks the upstream for identity, decodes what comes coded all the same and cuts the
// answer at the budget as it does in clear: the client reads the answer in clear with the
// cut's error and finish, the tenant's use ends within one part per admitted answer of the
// limit, and the answer is counted in gateway_stream_encoded_total. An answer in a coding the
// gateway cannot read (x-xor) reaches the client as it came, is charged every byte as text
// and ends at the budget too.
func TestCodedAnswersKeepTheBudget(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{"pool", "standard"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			up := newCodingUpstream(t)
			p := startGatewayRaw(t, fmt.Sprintf("upstream: {url: %q, transport: %s}\n", up.url, transport)+codingOrgs()+codingConfig)
			var wg sync.WaitGroup
			var mu sync.Mutex
			want := map[string]int{} // gateway_stream_encoded_total's series: the admitted answers
			for coding, ce := range answerCodings {
				// The label is the outermost coding (br for gzip under br), other for x-xor.
				label := strings.TrimSpace(ce[strings.LastIndex(ce, ",")+1:])
				if coding == "xor" {
					label = "other"
				}
				for _, v2 := range []bool{false, true} {
					route := map[bool]string{false: "assistant_message", true: "assistant_message_v2"}[v2]
					wg.Add(1)
					go func() {
						defer wg.Done()
						n := checkCodedBudget(t, p, coding, v2)
						mu.Lock()
						want[`gateway_stream_encoded_total{encoding="`+label+`",route="`+route+`"}`] += n
						mu.Unlock()
					}()
				}
			}
			wg.Wait()
			m := scrape(t, p)
			for series, n := range want {
				if m[series] != float64(n) {
					t.Errorf("%s: %v, want %d", series, m[series], n)
				}
			}
			for _, ae := range up.acceptedAll() {
				if ae != "identity" {
					t.Fatalf("an upstream request of a stream route accepted %q, want identity", ae)
				}
			}
		})
	}
}

// checkCodedBudget runs the reproduction of one coding and route version and returns how
// many answers were admitted.
func checkCodedBudget(t *testing.T, p *proc, coding string, v2 bool) int {
	version := map[bool]string{false: "v1", true: "v2"}[v2]
	org := coding + "-" + version
	var admitted, cut, refused int
	for i := range 8 {
		a := askCutAt(t, p, v2, org+"-docs", "svc_dsc_coded", "p-100-40-0", browserAccepts)
		ce := a.encoding
		if a.status == 429 {
			refused++
			continue
		}
		if a.status != 200 || a.err != nil {
			t.Errorf("%s answer %d: status %d, end %v", org, i, a.status, a.err)
			return admitted
		}
		admitted++
		all := strings.Join(a.parts, "")
		if coding == "xor" {
			if ce != "x-xor" {
				t.Errorf("%s: an answer the gateway cannot read reached the client as %q, not as it came", org, ce)
			}
			if a.texts() < 100 {
				cut++
			}
			continue
		}
		if ce != "" {
			t.Errorf("%s: the client got the answer in %q, want it in clear", org, ce)
		}
		if strings.Contains(all, "The answer was cut off: the token budget ran out.") {
			cut++
			end := a.parts[len(a.parts)-1]
			if (v2 && end != "data: [DONE]\n\n") || (!v2 && !strings.HasPrefix(end, `d:{"finishReason":"error"`)) {
				t.Errorf("%s: a cut answer ends with %q", org, end)
			}
		} else if a.texts() != 100 {
			t.Errorf("%s answer %d: %d text parts and no cutoff", org, i, a.texts())
		}
	}
	u := settledOrgUsage(t, p, org, "assistant_tokens_per_org")
	t.Logf("%s: %d admitted, %d cut, %d refused; used %d of %d", org, admitted, cut, refused, u.Used, u.Limit)
	// At most one part (10 tokens) per admitted answer past the limit. In x-xor a part is a
	// read from the upstream, dropped whole when it would cross the budget: none past it.
	part, spent := int64(10), u.Limit-100 // in clear, less than a reserve left refuses the next
	if coding == "xor" {
		// A read is at most the stream's 2 KiB copy buffer, 512 tokens: the answers admitted
		// on the last reserve end before a read that would cross.
		part, spent = 0, u.Limit-512
	}
	if over := u.Used - u.Limit; over > int64(admitted)*part {
		t.Errorf("%s: used %d, more than one part per admitted answer (%d) past the limit %d", org, u.Used, admitted, u.Limit)
	}
	if cut == 0 || (refused == 0 && coding != "xor") || u.Used < spent {
		t.Errorf("%s: the budget did not end the answers: %d cut, %d refused, used %d", org, cut, refused, u.Used)
	}
	return admitted
}

// settledOrgUsage waits until org holds no tokens of limit name any more and returns the reading.
func settledOrgUsage(t *testing.T, p *proc, org, name string) orgUsage {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		u := orgLimitUsage(t, p, org, name)
		if u.Reserved == 0 {
			return u
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s: still %d reserved", org, name, u.Reserved)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Routes whose answers the gateway does not read keep what the client and the upstream
// negotiate: an agent job's request keeps its Accept-Encoding and its gzip answer reaches the
// client as the upstream sent it.
func TestUnreadAnswersKeepTheirCoding(t *testing.T) {
	t.Parallel()
	up := newCodingUpstream(t)
	p := startGateway(t, up.url, "")
	req, _ := http.NewRequest("POST", "http://"+p.public+"/v2/agent/my-project/job", strings.NewReader(`{"prompt":"Document the rate limits"}`))
	req.Header.Set("Authorization", "Bearer svc_coded")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept-Encoding", "gzip, br")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 201 || res.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("status %d, Content-Encoding %q", res.StatusCode, res.Header.Get("Content-Encoding"))
	}
	z, err := gzip.NewReader(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(z)
	if err != nil || string(body) != `{"jobId":"job_1"}` {
		t.Fatalf("%q %v", body, err)
	}
	if got := up.acceptedAll(); len(got) != 1 || got[0] != "gzip, br" {
		t.Fatalf("the upstream saw Accept-Encoding %q", got)
	}
}

// Real Chromium on another origin sends its own Accept-Encoding (it cannot be set by a page):
// the gateway asks the upstream for identity, the upstream answers in br all the same, and the
// page reads the answer in clear, cut at the budget like any other, to its clean end.
func TestCodedAnswerBrowser(t *testing.T) {
	t.Parallel()
	up := newCodingUpstream(t)
	p := browserCut(t, up.cutUpstream, codingOrgs()+codingConfig, "br-v2-docs", "p-300-40-1")
	u := settledOrgUsage(t, p, "br-v2", "assistant_tokens_per_org")
	if u.Used > u.Limit+10 || u.Used < u.Limit-100 {
		t.Fatalf("used %d of %d", u.Used, u.Limit)
	}
	for _, ae := range up.acceptedAll() {
		if ae != "identity" {
			t.Fatalf("the upstream was asked for %q, want identity", ae)
		}
	}
	if m := scrape(t, p); m[`gateway_stream_encoded_total{encoding="br",route="assistant_message_v2"}`] != 1 {
		t.Fatalf("gateway_stream_encoded_total of br: %v", m[`gateway_stream_encoded_total{encoding="br",route="assistant_message_v2"}`])
	}
}
