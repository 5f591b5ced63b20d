package admin

import (
	_ "embed"
	"net/http"
)

// openAPI is the OpenAPI 3.1 document of the admin API, served as it is at GET /openapi.json.
//
//go:embed openapi.json
var openAPI []byte

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(openAPI)
}
