package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// fullConfig turns gatewayConfig's into gateway-full's: every feature of config.example.yaml
// on. Keys are looked up in the registry (auth.mode: registry, on Redis; registerKeys adds the
// bench's two), the streamed routes apply the example's six limits (the three requests limits,
// two tokens limits holding a reserve that is settled when the answer ends, a streams slot;
// limits raised so nothing is denied), and tracing is on at its default ratio (0.01,
// parent-based) into otlp. Usage history and the run-time quota check are on in every
// variant (the limits' defaults).
func fullConfig(cfg, otlp string) string {
	cfg = strings.Replace(cfg, "auth:\n  failure_limit: 0\n", "auth:\n  mode: registry\n  failure_limit: 0\n", 1)
	six := "[assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org, assistant_tokens_per_ip, assistant_streams_per_org]"
	cfg = strings.Replace(cfg, "routes:\n", "routes:\n  - name: assistant_message\n    limits: "+six+"\n  - name: assistant_message_v2\n    limits: "+six+"\n", 1)
	// limits: is the last block: these go on with it.
	cfg += `  assistant_tokens_per_org: { limit: 1000000000000, window: month, by: org, unit: tokens, mode: shadow, reserve: 4000, reserve_ttl: 10m }
  assistant_tokens_per_ip: { limit: 1000000000000, window: day, by: ip, unit: tokens, reserve: 4000 }
  assistant_streams_per_org: { limit: 1000000000, by: org, unit: streams, mode: shadow }
tracing:
  enabled: true
  endpoint: "` + otlp + `"
`
	return cfg
}

// registerKeys adds the bench's admin and assistant keys to the gateway's registry through
// its admin API, by digest (the raw keys are the bench's fixed ones).
func registerKeys(admin string) error {
	digest := func(key string) string { sum := sha256.Sum256([]byte(key)); return hex.EncodeToString(sum[:]) }
	for _, k := range []map[string]any{
		{"digest": digest(adminKey), "kind": "admin", "org": "bench", "projects": []string{"proj-bench"}, "label": "bench"},
		{"digest": digest(assistantKey), "kind": "assistant", "org": "bench", "domains": []string{"bench-docs"}, "label": "bench"},
	} {
		body, _ := json.Marshal(k)
		req, _ := http.NewRequest(http.MethodPost, admin+"/keys", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+adminToken)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("registering a key: %w", err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode/100 != 2 {
			return fmt.Errorf("registering a key: %s: %s", res.Status, b)
		}
	}
	return nil
}

// otlpSink is a trace collector that takes every OTLP/HTTP export and discards it (an empty
// ExportTraceServiceResponse is an empty body), in benchrun's process, on the load
// generators' CPU. It returns its base URL.
func otlpSink() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}
