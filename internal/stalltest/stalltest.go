// Package stalltest is a client that stops reading an answer, for the write-stall tests.
//
// Stalltest is a client that stops reading an answer, for the tests of the gateway's
// write-stall bound (server.write_stall_timeout).
package stalltest

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// StopReading POSTs body with header to path on the server at addr (host:port) over proto,
// reads the answer's headers, which must say 200, and then reads nothing more: "h1" on a raw
// connection with a small receive buffer, whose TCP window shuts; "h2c" HTTP/2 with prior
// knowledge and small flow-control windows, whose stream window shuts while the connection
// is still read. The connection stays open until the test ends.
func StopReading(t testing.TB, proto, addr, path string, header http.Header, body string) {
	t.Helper()
	if proto == "h1" {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
		var head strings.Builder
		fmt.Fprintf(&head, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n", path, addr, len(body))
		_ = header.Write(&head)
		if _, err := fmt.Fprintf(c, "%s\r\n%s", head.String(), body); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		res, err := http.ReadResponse(bufio.NewReaderSize(c, 4<<10), nil)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("stalltest: %v %v", res, err)
		}
		return
	}
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protos, HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: 64 << 10, MaxReceiveBufferPerConnection: 64 << 10}}
	t.Cleanup(tr.CloseIdleConnections)
	req, err := http.NewRequest("POST", "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header.Clone()
	res, err := tr.RoundTrip(req)
	if err != nil || res.StatusCode != 200 || res.ProtoMajor != 2 {
		t.Fatalf("stalltest: %v %v", res, err)
	}
	t.Cleanup(func() { res.Body.Close() })
}
