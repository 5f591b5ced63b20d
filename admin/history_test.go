package admin

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/limits"
)

// failingExport lists rows, then fails as a store that goes away mid-answer would. (Redis
// cannot be made to fail between two pages of an export on cue; the binary tests cover the
// real stores.)
type failingExport struct {
	rows   int
	closed bool
}

func (f *failingExport) History(context.Context, string, string, string) (limits.TenantHistory, error) {
	return limits.TenantHistory{}, errors.New("unused")
}

func (f *failingExport) Export(context.Context, string, string, string) (limits.Export, error) {
	return limits.Export{
		Limit: "per_org", Unit: "requests", Start: time.Unix(0, 0), End: time.Unix(3600, 0), Tenants: f.rows + 1,
		Rows: func(yield func(limits.ExportRow, error) bool) {
			for i := range f.rows {
				if !yield(limits.ExportRow{ID: strings.Repeat("x", 40) + string(rune('a'+i%26)), Used: 1}, nil) {
					return
				}
			}
			yield(limits.ExportRow{}, errors.New("limits: export: read: connection refused"))
		},
		Close: func() error { f.closed = true; return nil },
	}, nil
}

// A store failing after the first rows are sent breaks the connection: the client sees an
// incomplete transfer (CSV and JSON alike), never a shorter file that looks whole, and the
// listing is freed.
func TestExportCutShortBreaksTheConnection(t *testing.T) {
	for _, format := range []string{"csv", "json"} {
		f := &failingExport{rows: 5000} // more than the first flush
		srv := httptest.NewServer(Handler(Options{
			Ready:   func() (bool, string) { return true, "ready" },
			Metrics: http.NotFoundHandler(),
			History: f, TopTimeout: time.Second, UsageTimeout: time.Second,
			Logger: zap.NewNop(),
		}))
		res, err := http.Get(srv.URL + "/usage/export?limit=per_org&window=current&format=" + format)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		srv.Close()
		if res.StatusCode != 200 || err == nil || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s: status %d, %d bytes read, error %v: want 200 and an unexpected EOF", format, res.StatusCode, len(body), err)
		}
		if !f.closed {
			t.Errorf("%s: the listing was not closed", format)
		}
	}
}
