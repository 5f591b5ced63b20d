package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
)

// A new operator's gateway with its admin listener on another port than the default (issue
// 45, item 3), against the binary: `usage` and `quota` take -config and find the listener,
// its TLS and its token in the file (on all interfaces, over HTTPS with a self-signed
// certificate and no -cacert, over plain HTTP); -admin wins over -config, and -config over
// GATEWAY_ADMIN_URL; a listener that does not answer is an error naming the URL, where it came
// from and the three ways to point the CLI at the right one.
func TestAdminCLIFindsItsListener(t *testing.T) {
	t.Parallel()
	up, _ := recordingUpstream(t)
	certFile, keyFile, pool := selfSigned(t)
	dead := "http://" + deadAddr(t)
	cases := []struct {
		name string
		o    startOpts
		cfg  string
	}{
		{"plain on loopback", startOpts{}, ""},
		{"all interfaces", startOpts{adminHost: "0.0.0.0"}, ""},
		{"admin_tls, self-signed", startOpts{adminCAs: pool}, fmt.Sprintf("admin_tls: {cert_file: %q, key_file: %q}\n", certFile, keyFile)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := startGatewayWith(t, c.o, fmt.Sprintf("upstream: {url: %q}\n%s%s", up, quotaCfg, c.cfg))
			cfg := p.cmd.Args[2]
			if r := job(t, p, "p1"); r.StatusCode != 201 {
				t.Fatalf("job: %d", r.StatusCode)
			}
			// No GATEWAY_ADMIN_TOKEN: the file's admin_token is used.
			for _, args := range [][]string{
				{"usage", "top", "--limit", "agent_job_per_project", "-config", cfg},
				{"quota", "audit", "-config", cfg},
				{"usage", "top", "-config", cfg, "-json"},
			} {
				code, out, errOut := cliRun(t, []string{"GATEWAY_ADMIN_URL=" + dead}, "", args...)
				if code != 0 || errOut != "" {
					t.Fatalf("gateway %v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
				}
				if args[1] == "top" && !strings.Contains(out, "p1") {
					t.Fatalf("gateway %v does not list p1:\n%s", args, out)
				}
			}
			// -admin wins over -config.
			code, _, errOut := cliRun(t, nil, "", "usage", "top", "-config", cfg, "-admin", dead)
			if code != 1 || !strings.Contains(errOut, "the admin API at "+dead+" (-admin) does not answer") {
				t.Fatalf("-admin beside -config: exit %d, %q", code, errOut)
			}
			if c.o.adminCAs == nil {
				return
			}
			// The file's certificate is trusted, not any: a config naming another one for
			// the same listener, or none with -admin https://..., is refused the connection.
			data, err := os.ReadFile(cfg)
			if err != nil {
				t.Fatal(err)
			}
			otherCert, _, _ := selfSigned(t)
			code, _, errOut = cliRun(t, nil, "", "usage", "top", "-config", writeConfig(t, strings.Replace(string(data), certFile, otherCert, 1)))
			if code != 1 || !strings.Contains(errOut, "does not answer") || !strings.Contains(errOut, "certificate") {
				t.Fatalf("-config naming another certificate: exit %d, %q; want the TLS check to refuse", code, errOut)
			}
			code, _, errOut = cliRun(t, nil, "", "usage", "top", "-admin", "https://"+p.admin, "-config", writeConfig(t, fmt.Sprintf("upstream: {url: %q}\n%s", up, quotaCfg)))
			if code != 1 || !strings.Contains(errOut, "certificate") {
				t.Fatalf("https without the certificate trusted: exit %d, %q; want the TLS check to refuse", code, errOut)
			}
		})
	}

	// Not answering: the error names the URL, its source and every way to set it.
	ways := "point the CLI at the gateway's admin listener with -admin URL, GATEWAY_ADMIN_URL or -config FILE (its admin_listen)"
	for _, c := range []struct {
		env  []string
		args []string
		from string
	}{
		{[]string{"GATEWAY_ADMIN_URL=" + dead}, []string{"usage", "top"}, "(GATEWAY_ADMIN_URL)"},
		{nil, []string{"quota", "audit", "-admin", dead}, "(-admin)"},
		{nil, []string{"usage", "show", "--org", "acme", "-config", writeConfig(t, fmt.Sprintf("upstream: {url: %q}\nadmin_listen: %q\n", up, strings.TrimPrefix(dead, "http://")))}, "(admin_listen of "},
	} {
		code, out, errOut := cliRun(t, c.env, "", c.args...)
		if code != 1 || out != "" || !strings.HasPrefix(errOut, "gateway: the admin API at "+dead+" "+c.from) || !strings.Contains(errOut, ways) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("gateway %v: exit %d, stdout %q, stderr %q\nwant exit 1 and one line naming %s %s and %q", c.args, code, out, errOut, dead, c.from, ways)
		}
	}
	// The default, when nothing listens on it here.
	if conn, err := net.Dial("tcp", "127.0.0.1:9090"); err == nil {
		conn.Close()
	} else if errors.Is(err, syscall.ECONNREFUSED) {
		if code, _, errOut := cliRun(t, nil, "", "usage", "top"); code != 1 || !strings.Contains(errOut, "the admin API at http://127.0.0.1:9090 (the default) does not answer") || !strings.Contains(errOut, ways) {
			t.Errorf("usage top with nothing set: exit %d, %q", code, errOut)
		}
	}
	// A -config that is not a valid config is a config error, found before any request.
	if code, _, errOut := cliRun(t, nil, "", "usage", "top", "-config", writeConfig(t, "upstream: {url: 'http://127.0.0.1:1', timout: 3s}\n")); code != 2 || !strings.Contains(errOut, "upstream.timout: unknown key") {
		t.Errorf("usage top with a bad -config: exit %d, %q", code, errOut)
	}
}

// The admin token in the CLI (issue 45, item 4), against the binary: no token set, a wrong
// one, and a gateway without admin_token are three different errors, each saying what to set,
// none repeating the HTTP-level text or the token.
func TestAdminCLITokenErrors(t *testing.T) {
	t.Parallel()
	up, _ := recordingUpstream(t)
	p := startGateway(t, up, quotaCfg)
	admin := "http://" + p.admin
	const wrong = "not-the-admin-token-0123456789"
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"usage", "top", "-admin", admin},
			"gateway: invalid_credentials: the admin API at " + admin + " needs the admin token and none is set: set GATEWAY_ADMIN_TOKEN to the gateway's admin_token (or give -config FILE, whose admin_token is used)\n"},
		{[]string{"GATEWAY_ADMIN_URL=" + admin}, []string{"quota", "audit"},
			"gateway: invalid_credentials: the admin API at " + admin + " needs the admin token and none is set"},
		{[]string{"GATEWAY_ADMIN_TOKEN=" + wrong}, []string{"quota", "grant", "-admin", admin, "--limit", "agent_job_per_project", "--id", "p1", "--amount", "1", "--reason", "r"},
			"gateway: invalid_credentials: the admin API at " + admin + " refused the token from GATEWAY_ADMIN_TOKEN: it is not that gateway's admin_token\n"},
		// The file's token is the other gateway's: the message says where it came from.
		{nil, []string{"usage", "top", "-admin", admin, "-config", writeConfig(t, fmt.Sprintf("upstream: {url: %q}\nadmin_token: %q\n", up, wrong))},
			"refused the token from admin_token of "},
	} {
		code, out, errOut := cliRun(t, c.env, "", c.args...)
		if code != 1 || out != "" || !strings.Contains(errOut, c.want) || !serverLine.MatchString(errOut) {
			t.Errorf("gateway %v: exit %d, stdout %q, stderr %q\nwant exit 1 and %q", c.args, code, out, errOut, c.want)
		}
		if strings.Contains(errOut, "Authorization: Bearer") || strings.Contains(errOut, wrong) {
			t.Errorf("gateway %v printed the HTTP-level text or the token: %q", c.args, errOut)
		}
	}

	// A gateway without admin_token refuses writes: the CLI says to set one there.
	open := startGateway(t, up, "")
	code, _, errOut := cliRun(t, []string{"GATEWAY_ADMIN_TOKEN=" + wrong}, "", "quota", "reset", "-admin", "http://"+open.admin,
		"--limit", "agent_job_per_project", "--id", "p1", "--reason", "r")
	if code != 1 || !strings.HasPrefix(errOut, "gateway: admin_token_required: the gateway at http://"+open.admin+" has no admin_token") {
		t.Errorf("quota reset on a gateway without admin_token: exit %d, %q", code, errOut)
	}
}

// What a newcomer trips on in the CLI's tables (issue 45, item 13), against the binary: a
// streams limit reads "streams in flight", not "(, streams)"; a tenant on the default limits
// shows the plan "default", as the usage page does; an empty keys list says so and where.
func TestCLITablesSayWhatTheyMean(t *testing.T) {
	t.Parallel()
	up, _ := recordingUpstream(t)
	keysFile := writeConfig(t, "") // an empty keys file
	p := startGateway(t, up, quotaCfg+"  assistant_streams_per_org: {limit: 5, by: org, unit: streams}\n"+
		"routes:\n  - {name: assistant_message_v2, limits: [assistant_per_org, assistant_streams_per_org]}\n"+
		fmt.Sprintf("auth: {keys_file: %q}\n", keysFile))
	if r := job(t, p, "p1"); r.StatusCode != 201 {
		t.Fatalf("job: %d", r.StatusCode)
	}
	env := []string{"GATEWAY_ADMIN_URL=http://" + p.admin, "GATEWAY_ADMIN_TOKEN=" + quotaToken}
	code, out, errOut := cliRun(t, env, "", "usage", "top", "--limit", "assistant_streams_per_org")
	if code != 0 || out != "assistant_streams_per_org (streams in flight)\n  no answer in flight\n" {
		t.Errorf("usage top of a streams limit: exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
	code, out, errOut = cliRun(t, env, "", "usage", "top", "--limit", "agent_job_per_project")
	lines := strings.Split(out, "\n")
	if code != 0 || len(lines) < 3 || lines[0] != "agent_job_per_project (requests per hour)" || strings.Fields(lines[2])[0] != "p1" || strings.Fields(lines[2])[2] != "default" {
		t.Errorf("usage top: exit %d, stderr %q, want p1 on the plan \"default\":\n%s", code, errOut, out)
	}
	code, out, errOut = cliRun(t, nil, "", "keys", "list", "-config", p.cmd.Args[2])
	if code != 0 || out != "no keys are registered in auth.keys_file "+keysFile+"\n" {
		t.Errorf("keys list of an empty registry: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, out, _ = cliRun(t, nil, "", "keys", "list", "-config", p.cmd.Args[2], "-json"); code != 0 || out != "" {
		t.Errorf("keys list -json of an empty registry: exit %d, %q, want nothing", code, out)
	}
}
