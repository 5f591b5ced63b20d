package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The test vector of the Standard Webhooks reference libraries.
const (
	vectorSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTimestamp = "1614265330"
	vectorBody      = `{"test": 2432232314}`
	vectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

// readmeBlock returns the first fenced block of lang after heading in README.md.
func readmeBlock(t *testing.T, heading, lang string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no %q", heading)
	}
	_, block, ok := strings.Cut(after, "\n```"+lang+"\n")
	if !ok {
		t.Fatalf("README.md: no %s block under %q", lang, heading)
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatalf("README.md: the %s block under %q is not closed", lang, heading)
	}
	return block
}

// The README's Go verification accepts the reference vector, a rotation's two signatures, and
// nothing altered.
func TestReadmeWebhookVerificationGo(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	code := readmeBlock(t, "## Verifying webhook signatures", "go")
	dir := t.TempDir()
	src := `package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
)

` + code + `

func main() {
	body := []byte(` + "`" + vectorBody + "`" + `)
	fmt.Println(
		verify("` + vectorSecret + `", "` + vectorID + `", "` + vectorTimestamp + `", body, "` + vectorSignature + `"),
		verify("` + vectorSecret + `", "` + vectorID + `", "` + vectorTimestamp + `", body, "v1,c29tZXRoaW5nIGVsc2U= ` + vectorSignature + `"),
		verify("` + vectorSecret + `", "` + vectorID + `", "` + vectorTimestamp + `", append(body, ' '), "` + vectorSignature + `"),
		verify("` + vectorSecret + `", "` + vectorID + `", "1614265331", body, "` + vectorSignature + `"),
		verify("` + vectorSecret + `", "` + vectorID + `", "` + vectorTimestamp + `", body, "v1a,` + strings.TrimPrefix(vectorSignature, "v1,") + `"),
	)
}
`
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gobin, "run", "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GO111MODULE=off", "GOFLAGS=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "true true false false false" {
		t.Fatalf("verify: %s, want true true false false false", got)
	}
}

// The README's shell recipe computes the reference vector's signature.
func TestReadmeWebhookVerificationShell(t *testing.T) {
	for _, tool := range []string{"bash", "openssl", "xxd", "base64"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s", tool)
		}
	}
	code := readmeBlock(t, "## Verifying webhook signatures", "sh")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "body.json"), []byte(vectorBody), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", code)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SECRET="+vectorSecret, "ID="+vectorID, "TS="+vectorTimestamp)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != vectorSignature {
		t.Fatalf("got %s, want %s", got, vectorSignature)
	}
}
