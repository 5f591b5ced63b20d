package main

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// partsUpstream answers assistant requests with an AI SDK data stream of parts text parts,
// each text, sent at once, and then nothing until the request goes away (no finish, no usage:
// an answer still running).
func partsUpstream(t *testing.T, parts int, text string) string {
	return serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "f:{\"messageId\":\"m\"}\n")
		for range parts {
			fmt.Fprintf(w, "0:%q\n", text)
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
}

// openAnswer sends an assistant request of acme through p and reads its answer until parts
// text parts came; the answer stays open (close ends it).
func openAnswer(t *testing.T, p *proc, key, message string, parts int) (close func()) {
	t.Helper()
	body := `{"fp":"x","messages":[{"id":"1","role":"user","content":"` + message + `"}]}`
	req, _ := http.NewRequest("POST", "http://"+p.public+"/discovery/v1/assistant/acme-docs/message", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("answer: %v %v", res, err)
	}
	sc := bufio.NewScanner(res.Body)
	for got := 0; got < parts; {
		if !sc.Scan() {
			t.Fatalf("the answer ended after %d of %d parts: %v", got, parts, sc.Err())
		}
		if strings.HasPrefix(sc.Text(), "0:") {
			got++
		}
	}
	var once sync.Once
	return func() { once.Do(func() { res.Body.Close() }) }
}

// The reproduction, on two replicas sharing Redis and on a Cluster: six answers pass
// 13 parts each (180 tokens each by the gateway's estimate: 11 of the conversation's text,
// 169 of the answer's) and their replica is killed with SIGKILL. Their holds carried what the
// answers had passed as of their last refresh (every 750 ms: reserve_ttl 3s), so once the
// holds expire the tenant's next request, on the other replica, charges the 1,080 tokens: the
// crash loses at most what passed since each answer's last refresh (here nothing: every part
// passed before it). The requests were counted once.
func TestKilledReplicaAnswersCharged(t *testing.T) {
	t.Parallel()
	const (
		message = "How can I rotate a key without any downtime?"         // 44 bytes: 11 tokens
		text    = "Rotate it with an overlap: add the new key, then go." // 52 bytes
		parts   = 13                                                     // 676 bytes: 169 tokens
		each    = 11 + 169
	)
	if len(message) != 44 || len(text) != 52 {
		t.Fatal("the texts' lengths are the test's arithmetic")
	}
	up := partsUpstream(t, parts, text)
	for _, st := range holdStores()[1:] {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			ps := startReplicas(t, up, st, `orgs: {acme: [acme-docs]}
limits:
  assistant_tokens_per_org: {limit: 100000, window: month, by: org, unit: tokens, reserve: 100, reserve_ttl: 3s}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org]
`)
			doomed, survivor := ps[0], ps[1]
			for i := range 6 {
				openAnswer(t, doomed, fmt.Sprintf("svc_dsc_crash%d", i), message, parts) // ends with the replica
			}
			if u := acmeUsage(t, survivor, "assistant_tokens_per_org"); u.Used != 0 || u.Reserved != 600 {
				t.Fatalf("six answers in flight: %+v", u)
			}
			// Every part passed; at least one refresh (every 750 ms) after the last.
			time.Sleep(2 * time.Second)
			if err := doomed.cmd.Process.Kill(); err != nil { // SIGKILL: nothing is settled
				t.Fatal(err)
			}
			// The holds expire within reserve_ttl of the last refresh; reads charge nothing.
			waitUsage(t, survivor, "assistant_tokens_per_org", 0, 0, 10*time.Second)
			// The tenant's next request reaps them: 1,080 charged, its own 100 held.
			end := openAnswer(t, survivor, "svc_dsc_after", message, parts)
			if u := acmeUsage(t, survivor, "assistant_tokens_per_org"); u.Used != 6*each || u.Reserved != 100 {
				t.Fatalf("after the replica died: %+v, want %d used (6 answers of %d) and 100 held", u, 6*each, each)
			}
			if u := acmeUsage(t, survivor, "assistant_per_org"); u.Used != 7 {
				t.Fatalf("requests: %+v, want 7 (each counted once)", u)
			}
			end() // the client goes away: charged what passed, as any answer
			waitUsage(t, survivor, "assistant_tokens_per_org", 7*each, 0, 10*time.Second)
		})
	}
}
