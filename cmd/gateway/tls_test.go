package main

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// selfSigned writes a certificate for 127.0.0.1 and returns the file paths and a pool trusting it.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "gateway-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// With tls: the public listener serves HTTPS with HTTP/2, and streams still flow part by part.
func TestTLSListenerStreamsOverHTTP2(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	upURL := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "0:\"first\"\n")
		http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		fmt.Fprint(w, "d:{\"finishReason\":\"stop\"}\n")
	}))

	certFile, keyFile, pool := selfSigned(t)
	// The admin listener follows tls too (no admin_tls): the start waits on it over HTTPS.
	p := startGatewayWith(t, startOpts{adminCAs: pool}, fmt.Sprintf("upstream:\n  url: %q\ntls:\n  cert_file: %q\n  key_file: %q\n", upURL, certFile, keyFile))
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	req, _ := http.NewRequest("POST", "https://"+p.public+"/discovery/v1/assistant/acme/message", strings.NewReader(`{"fp":"a","messages":[]}`))
	req.Header.Set("Authorization", "Bearer svc_dsc_tls")
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.ProtoMajor != 2 {
		t.Fatalf("proto %s, want HTTP/2", res.Proto)
	}
	br := bufio.NewReader(res.Body)
	first, err := br.ReadString('\n') // readable while the upstream still holds the rest
	if err != nil || first != "0:\"first\"\n" {
		t.Fatalf("first part %q %v", first, err)
	}
	close(release)
	rest, _ := br.ReadString('\n')
	if rest != "d:{\"finishReason\":\"stop\"}\n" {
		t.Fatalf("rest %q", rest)
	}
}
