package admin

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/zap"
)

// Every admin endpoint but the health checks needs the token, as a bearer token or as the
// Basic auth password with any user name; a refusal asks browsers for Basic credentials.
func TestGuardBearerAndBasic(t *testing.T) {
	const token = "guard-test-token-0123456789"
	h := Handler(Options{
		Ready:   func() (bool, string) { return true, "ready" },
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("metrics")) }),
		Token:   token,
		Logger:  zap.NewNop(),
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	do := func(path string, set func(*http.Request)) *http.Response {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		if set != nil {
			set(req)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	for _, c := range []struct {
		name string
		set  func(*http.Request)
		want int
	}{
		{"none", nil, 401},
		{"bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) }, 200},
		{"bearer wrong", func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") }, 401},
		{"basic any user", func(r *http.Request) { r.SetBasicAuth("anyone", token) }, 200},
		{"basic empty user", func(r *http.Request) { r.SetBasicAuth("", token) }, 200},
		{"basic wrong password", func(r *http.Request) { r.SetBasicAuth("admin", token+"x") }, 401},
		{"basic token as user", func(r *http.Request) { r.SetBasicAuth(token, "") }, 401},
		{"token without scheme", func(r *http.Request) { r.Header.Set("Authorization", token) }, 401},
	} {
		res := do("/metrics", c.set)
		if res.StatusCode != c.want {
			t.Errorf("%s: %d, want %d", c.name, res.StatusCode, c.want)
		}
		if c.want == 401 {
			if got := res.Header.Values("WWW-Authenticate"); len(got) == 0 || got[0] != `Basic realm="gateway"` {
				t.Errorf("%s: WWW-Authenticate %q", c.name, got)
			}
		}
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if res := do(p, nil); res.StatusCode != 200 {
			t.Errorf("%s without token: %d", p, res.StatusCode)
		}
	}
}
