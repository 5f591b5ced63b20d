package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/docsgate/gateway/config"
)

// adminClient is how a CLI command reaches a running gateway's admin API: the listener's URL,
// the TLS it trusts and the admin token, each with where it came from, so that an error can
// say what to change. adminFlags.client builds it.
type adminClient struct {
	base      string // scheme://host:port, no trailing slash
	baseFrom  string // "-admin", "admin_listen of FILE", "GATEWAY_ADMIN_URL" or "the default"
	token     string
	tokenFrom string // "GATEWAY_ADMIN_TOKEN" or "admin_token of FILE"; "" when no token is set
	http      *http.Client
}

// defaultAdminURL is where the CLI looks without -admin, -config or GATEWAY_ADMIN_URL: the
// default admin_listen.
const defaultAdminURL = "http://127.0.0.1:9090"

// client resolves, without the network, where and how to reach the admin API. The URL is, in
// this order, -admin, the admin_listen of -config (https when the file sets tls or
// admin_tls), GATEWAY_ADMIN_URL, then the default. The token is GATEWAY_ADMIN_TOKEN, else the
// admin_token of -config. TLS trusts -cacert, else the system's roots, and with -config also
// the admin listener's own certificate from the file (by its bytes, whatever name it was
// issued for: the file is the gateway's own). Errors are usage or config errors (exit 2).
func (a *adminFlags) client(getenv func(string) string) (*adminClient, error) {
	c := &adminClient{token: getenv("GATEWAY_ADMIN_TOKEN")}
	if c.token != "" {
		c.tokenFrom = "GATEWAY_ADMIN_TOKEN"
	}
	var cfg *config.Config
	if a.config != "" {
		var err error
		if cfg, err = config.Load(a.config, os.LookupEnv); err != nil {
			return nil, err
		}
		if c.token == "" && cfg.AdminToken != "" {
			c.token, c.tokenFrom = cfg.AdminToken, "admin_token of "+a.config
		}
	}
	switch {
	case a.admin != "":
		c.base, c.baseFrom = a.admin, "-admin"
	case cfg != nil:
		c.base, c.baseFrom = listenURL(cfg.AdminListen, cfg.AdminTLS != nil || cfg.TLS != nil), "admin_listen of "+a.config
	case getenv("GATEWAY_ADMIN_URL") != "":
		c.base, c.baseFrom = getenv("GATEWAY_ADMIN_URL"), "GATEWAY_ADMIN_URL"
	default:
		c.base, c.baseFrom = defaultAdminURL, "the default"
	}
	u, err := url.Parse(c.base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("the admin URL %q (%s): want http://host:port or https://host:port", printable(clipArg(c.base)), c.baseFrom)
	}
	c.base = strings.TrimSuffix(c.base, "/")
	tlsCfg, err := a.trust(cfg, u.Hostname())
	if err != nil {
		return nil, err
	}
	c.http = &http.Client{
		Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: tlsCfg},
		// The admin API never redirects; a redirect would also leave the host the TLS check
		// below is for.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return c, nil
}

// listenURL is the URL a client on this host reaches a listener at: an unspecified host
// (":9090", "0.0.0.0:9090", "[::]:9090") is reached on loopback.
func listenURL(listen string, https bool) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		host, port = listen, ""
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	scheme := "http://"
	if https {
		scheme = "https://"
	}
	return scheme + net.JoinHostPort(host, port)
}

// trust is the TLS the client verifies the admin listener at host with (see client).
func (a *adminFlags) trust(cfg *config.Config, host string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if a.cacert != "" {
		certs, err := readCerts(a.cacert)
		if err != nil {
			return nil, fmt.Errorf("-cacert: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		for _, c := range certs {
			tc.RootCAs.AddCert(c)
		}
	}
	if cfg == nil {
		return tc, nil
	}
	key, own := "tls.cert_file", cfg.TLS
	if cfg.AdminTLS != nil {
		key, own = "admin_tls.cert_file", cfg.AdminTLS
	}
	if own == nil {
		return tc, nil
	}
	pinned, err := readCerts(own.CertFile)
	if err != nil {
		return nil, fmt.Errorf("%s of %s: %w", key, a.config, err)
	}
	roots := tc.RootCAs
	// The usual verification, by hand since it is skipped for the pinned certificate; against
	// the host dialled (the connection state names no server for an IP address).
	tc.InsecureSkipVerify = true
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the admin listener sent no certificate")
		}
		leaf := cs.PeerCertificates[0]
		for _, p := range pinned {
			if bytes.Equal(p.Raw, leaf.Raw) {
				return nil
			}
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, Intermediates: inter})
		return err
	}
	return tc, nil
}

// readCerts reads the PEM certificates of a file.
func readCerts(path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*x509.Certificate
	for {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	return out, nil
}

// do sends one request (body as JSON, or none) with the token when one is set, and returns
// the answer. An admin API that does not answer is an error naming the URL, where it came
// from and how to point the CLI elsewhere.
func (c *adminClient) do(ctx context.Context, method, path string, body any) (status int, data []byte, err error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	res, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is said once, below
		}
		return 0, nil, fmt.Errorf("the admin API at %s (%s) does not answer: %v; point the CLI at the gateway's admin listener with -admin URL, GATEWAY_ADMIN_URL or -config FILE (its admin_listen)",
			c.base, c.baseFrom, err)
	}
	defer res.Body.Close()
	data, err = io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return 0, nil, fmt.Errorf("reading the answer of the admin API at %s: %w", c.base, err)
	}
	return res.StatusCode, data, nil
}

// refusal words an error answer of the admin API as "CODE: MESSAGE": the API's own code and
// message, except where the CLI knows better what to do. A missing token and a wrong one are
// told apart, each saying what to set; an answer that is not the API's JSON (a proxy's page)
// keeps one readable line, with the HTTP status as its code.
func (c *adminClient) refusal(status int, data []byte) string {
	var e struct{ Error, Code string }
	if json.Unmarshal(data, &e) != nil || e.Code == "" {
		e.Error, e.Code = strings.TrimSpace(string(data)), fmt.Sprint(status)
		if strings.Contains(e.Error, "HTTP request to an HTTPS server") {
			e.Error = "the admin listener at " + c.base + " serves HTTPS: use an https:// URL (-admin, GATEWAY_ADMIN_URL) or -config FILE"
		}
	}
	if strings.TrimSpace(e.Error) == "" {
		e.Error = http.StatusText(status)
	}
	switch {
	case status == http.StatusUnauthorized && e.Code == "invalid_credentials" && c.token == "":
		e.Error = "the admin API at " + c.base + " needs the admin token and none is set: set GATEWAY_ADMIN_TOKEN to the gateway's admin_token (or give -config FILE, whose admin_token is used)"
	case status == http.StatusUnauthorized && e.Code == "invalid_credentials":
		e.Error = "the admin API at " + c.base + " refused the token from " + c.tokenFrom + ": it is not that gateway's admin_token"
	case status == http.StatusForbidden && e.Code == "admin_token_required":
		e.Error = "the gateway at " + c.base + " has no admin_token and refuses every write without one: set admin_token (or GATEWAY_ADMIN_TOKEN) in its config and reload or restart it, then set GATEWAY_ADMIN_TOKEN here"
	}
	return printable(e.Code) + ": " + printable(clipAnswer(e.Error))
}
