package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// adminTimeout bounds one CLI call to the admin API (`gateway quota`, `gateway usage`).
const adminTimeout = 15 * time.Second

// adminFlags are the flags every command that talks to the admin API takes. The admin token
// is read from GATEWAY_ADMIN_TOKEN, never from the command line.
type adminFlags struct {
	admin, cacert string
	asJSON        bool
}

func (a *adminFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	a.admin = getenv("GATEWAY_ADMIN_URL")
	if a.admin == "" {
		a.admin = "http://127.0.0.1:9090"
	}
	fs.StringVar(&a.admin, "admin", a.admin, "the admin listener's URL")
	fs.StringVar(&a.cacert, "cacert", "", "CA certificate (PEM) for an https admin URL")
	fs.BoolVar(&a.asJSON, "json", false, "print the JSON answer as it came")
}

// check validates the admin URL without the network.
func (a *adminFlags) check() error {
	if u, err := url.Parse(a.admin); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("-admin %q: want http://host:port or https://host:port", printable(clipArg(a.admin)))
	}
	return nil
}

// adminRequest is one request of a command to the admin API.
type adminRequest struct {
	method, path string
	body         any // JSON, or nil for none
}

// call sends c and prints its answer: the JSON as it came with -json, else through print. An
// error answer prints "gateway: CODE: MESSAGE" (the API's error code) and exits 1, as does an
// admin listener that does not answer.
func (a *adminFlags) call(ctx context.Context, c adminRequest, getenv func(string) string, stdout, stderr io.Writer, print func(io.Writer, []byte) error) int {
	client, err := adminHTTPClient(a.cacert)
	if err != nil {
		fmt.Fprintf(stderr, "gateway: %v\n", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	status, data, err := callAdmin(ctx, client, c.method, strings.TrimSuffix(a.admin, "/")+c.path, getenv("GATEWAY_ADMIN_TOKEN"), c.body)
	if err != nil {
		fmt.Fprintf(stderr, "gateway: the admin API does not answer: %v\n", err)
		return exitFailure
	}
	if status >= 300 {
		var e struct{ Error, Code string }
		if json.Unmarshal(data, &e) != nil || e.Code == "" {
			e.Error, e.Code = strings.TrimSpace(string(data)), strconv.Itoa(status)
		}
		if strings.TrimSpace(e.Error) == "" {
			e.Error = http.StatusText(status)
		}
		fmt.Fprintf(stderr, "gateway: %s: %s\n", printable(e.Code), printable(clipAnswer(e.Error)))
		return exitFailure
	}
	if a.asJSON {
		_, _ = stdout.Write(data)
		return exitOK
	}
	if err := print(stdout, data); err != nil {
		fmt.Fprintf(stderr, "gateway: reading the answer: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// clipAnswer keeps an error answer that is not the API's JSON (a proxy's HTML page) to one
// readable line.
func clipAnswer(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

func adminHTTPClient(cacert string) (*http.Client, error) {
	if cacert == "" {
		return &http.Client{}, nil
	}
	pem, err := os.ReadFile(cacert)
	if err != nil {
		return nil, fmt.Errorf("-cacert: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("-cacert %s: no PEM certificate", cacert)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}}}, nil
}

// callAdmin sends one admin API request with the token (when set) and returns the answer.
func callAdmin(ctx context.Context, client *http.Client, method, target, token string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	return res.StatusCode, data, err
}
