// Package resp reads a Redis server's INFO over plain RESP, for benchmarks that measure a
// server without a client library between them and it.
package resp

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// Info returns the text of INFO section from the server at addr.
func Info(addr, section string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "INFO "+section+"\r\n"); err != nil {
		return "", err
	}
	br := bufio.NewReader(c)
	head, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		return "", fmt.Errorf("INFO: %q %v", head, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil {
		return "", err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return "", err
	}
	return string(body), nil
}

// Field returns the value of field in an INFO text ("" when absent).
func Field(info, field string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}

// WaitReady polls the server at addr until it answers INFO, for up to timeout.
func WaitReady(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		_, err := Info(addr, "server")
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s not ready: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
