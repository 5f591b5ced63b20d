package proxy

import (
	"net/http"

	"github.com/docsgate/gateway/apierror"
)

// upgradeRefused answers 400 to a request asking to switch protocols (Upgrade: websocket, or
// h2c with HTTP2-Settings): these routes take none, and a forwarded upgrade would let the
// upstream switch protocols on a connection the gateway treats as HTTP. It reports whether it
// answered.
func upgradeRefused(s *scope, r *http.Request) bool {
	if len(r.Header["Upgrade"]) == 0 {
		return false
	}
	s.fail(http.StatusBadRequest, apierror.Body{
		Error: "Protocol upgrades (Upgrade: websocket, h2c) are not supported on this API; send a plain HTTP request.",
		Code:  apierror.UpgradeNotSupported,
	})
	return true
}
