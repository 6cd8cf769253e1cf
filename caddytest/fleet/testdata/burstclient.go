//go:build ignore

// burstclient is one client process of the fleet's late-reply test
// (late_test.go builds it in TestMain): it connects to the server first,
// prints "ready", waits until its standard input is closed (the release of
// the whole burst), then sends one GET on that connection and prints the
// status, the X-RateLimit-Limit header ("-" when absent) and the time the
// exchange took in microseconds.
//
//	burstclient <url> <X-User value>
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: burstclient <url> <user>")
		os.Exit(2)
	}
	u, err := url.Parse(os.Args[1])
	if err != nil {
		fail(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
	if err != nil {
		fail(err)
	}
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
		if c := conn; c != nil {
			conn = nil
			return c, nil
		}
		return nil, fmt.Errorf("burstclient: one connection only")
	}}
	req, err := http.NewRequest(http.MethodGet, u.String(), nil)
	if err != nil {
		fail(err)
	}
	req.Header.Set("X-User", os.Args[2])
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // returns when the parent closes it
	c := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		fail(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	limit := resp.Header.Get("X-Ratelimit-Limit")
	if limit == "" {
		limit = "-"
	}
	fmt.Println(resp.StatusCode, limit, time.Since(t0).Microseconds())
}

func fail(err error) {
	fmt.Println("error", err)
	os.Exit(1)
}
