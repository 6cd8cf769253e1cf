package caddytest_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// Connect procedures of grpc-go's interop TestService, served by
// connect-go behind Caddy.
const (
	connectUnary  = "/grpc.testing.TestService/UnaryCall"
	connectStream = "/grpc.testing.TestService/StreamingOutputCall"
)

// connectApp serves the two procedures with connect-go over HTTP/1.1 on a
// free loopback port, counting the calls that reach it; a server stream
// sends two messages.
func connectApp(t *testing.T) (calls *atomic.Int64, addr string) {
	t.Helper()
	calls = new(atomic.Int64)
	mux := http.NewServeMux()
	mux.Handle(connectUnary, connect.NewUnaryHandler(connectUnary,
		func(context.Context, *connect.Request[testpb.SimpleRequest]) (*connect.Response[testpb.SimpleResponse], error) {
			calls.Add(1)
			return connect.NewResponse(&testpb.SimpleResponse{}), nil
		}))
	mux.Handle(connectStream, connect.NewServerStreamHandler(connectStream,
		func(_ context.Context, _ *connect.Request[testpb.StreamingOutputCallRequest], s *connect.ServerStream[testpb.StreamingOutputCallResponse]) error {
			calls.Add(1)
			for range 2 {
				if err := s.Send(&testpb.StreamingOutputCallResponse{}); err != nil {
					return err
				}
			}
			return nil
		}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return calls, l.Addr().String()
}

// TestConnectRefusal: connect-go's client, through Caddy, against zones of
// 3 unary calls and 1 server stream per hour. Of 10 concurrent unary calls
// (protobuf), exactly 3 reach the service and 7 end with
// CodeResourceExhausted and the zone's message; a unary call in JSON
// (application/json with Connect-Protocol-Version) or as a GET
// (?connect=v1) is refused the same; of
// two server streams, the first receives its two messages and the second
// ends with CodeResourceExhausted, from the end-of-stream message.
func TestConnectRefusal(t *testing.T) {
	calls, app := connectApp(t)
	zu, zs := zoneName("connect_unary"), zoneName("connect_stream")
	load(t, newTester(t), config("", fmt.Sprintf(`
http://localhost:@A@ {
	rate_limit {
		zone %s {
			match {
				path %s
			}
			key static
			events 3
			window 1h
		}
		zone %s {
			match {
				path %s
			}
			key static
			events 1
			window 1h
		}
	}
	reverse_proxy %s {
		flush_interval -1
	}
}`, zu, connectUnary, zs, connectStream, app)))
	base := siteA
	hc := loopbackClient(16)
	unary := connect.NewClient[testpb.SimpleRequest, testpb.SimpleResponse](hc, base+connectUnary)
	ctx := t.Context()

	const c, lim = 10, 3
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := unary.CallUnary(ctx, connect.NewRequest(&testpb.SimpleRequest{}))
			key := "ok"
			if err != nil {
				key = connect.CodeOf(err).String()
				if want := "rate limit exceeded in zone " + zu + " (limit 3)"; connect.CodeOf(err) == connect.CodeResourceExhausted && errMessage(err) != want {
					t.Errorf("unary refusal message %q, want %q", errMessage(err), want)
				}
			}
			mu.Lock()
			codes[key]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Logf("unary, protobuf: %v", codes)
	if codes["ok"] != lim || codes[connect.CodeResourceExhausted.String()] != c-lim || calls.Load() != lim {
		t.Errorf("unary: %v, service saw %d; want exactly %d ok (and seen), %d resource_exhausted", codes, calls.Load(), lim, c-lim)
	}

	jsonUnary := connect.NewClient[testpb.SimpleRequest, testpb.SimpleResponse](hc, base+connectUnary, connect.WithProtoJSON())
	if _, err := jsonUnary.CallUnary(ctx, connect.NewRequest(&testpb.SimpleRequest{})); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("unary, JSON: %v, want resource_exhausted", err)
	}
	getUnary := connect.NewClient[testpb.SimpleRequest, testpb.SimpleResponse](hc, base+connectUnary,
		connect.WithHTTPGet(), connect.WithIdempotency(connect.IdempotencyNoSideEffects))
	req := connect.NewRequest(&testpb.SimpleRequest{})
	if _, err := getUnary.CallUnary(ctx, req); connect.CodeOf(err) != connect.CodeResourceExhausted || req.HTTPMethod() != http.MethodGet {
		t.Errorf("unary, GET: %v (sent as %s), want resource_exhausted", err, req.HTTPMethod())
	}

	stream := connect.NewClient[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse](hc, base+connectStream)
	for i, want := range []connect.Code{0, connect.CodeResourceExhausted} {
		s, err := stream.CallServerStream(ctx, connect.NewRequest(&testpb.StreamingOutputCallRequest{}))
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		n := 0
		for s.Receive() {
			n++
		}
		err = s.Err()
		_ = s.Close()
		switch {
		case want == 0 && (err != nil || n != 2):
			t.Errorf("stream %d: %d messages, %v; want 2 and no error", i, n, err)
		case want != 0 && (connect.CodeOf(err) != want || n != 0):
			t.Errorf("stream %d: %d messages, %v; want none and %v", i, n, err, want)
		case want != 0 && errMessage(err) != "rate limit exceeded in zone "+zs+" (limit 1)":
			t.Errorf("stream %d: message %q", i, errMessage(err))
		}
	}
	if got := calls.Load(); got != lim+1 {
		t.Errorf("the service saw %d calls, want %d (%d unary, 1 stream)", got, lim+1, lim)
	}
}

// TestConnectFailClosed: a fail closed zone whose Redis cannot be reached
// answers a Connect call unavailable, with the limiter's message, unary
// (HTTP 503) and streaming.
func TestConnectFailClosed(t *testing.T) {
	calls, app := connectApp(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close() // nothing listens there now
	z := zoneName("connect_fail_closed")
	load(t, newTester(t), config("", fmt.Sprintf(`
http://localhost:@A@ {
	rate_limit {
		zone %s {
			key static
			events 5
			window 1h
			fail closed
		}
		store redis redis://%s {
			timeout 50ms
		}
	}
	reverse_proxy %s
}`, z, dead, app)))
	hc := loopbackClient(2)
	want := "rate limiter unavailable in zone " + z
	unary := connect.NewClient[testpb.SimpleRequest, testpb.SimpleResponse](hc, siteA+connectUnary)
	if _, err := unary.CallUnary(t.Context(), connect.NewRequest(&testpb.SimpleRequest{})); connect.CodeOf(err) != connect.CodeUnavailable || errMessage(err) != want {
		t.Errorf("unary: %v, want unavailable %q", err, want)
	}
	stream := connect.NewClient[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse](hc, siteA+connectStream)
	s, err := stream.CallServerStream(t.Context(), connect.NewRequest(&testpb.StreamingOutputCallRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for s.Receive() {
		t.Error("stream: a message received")
	}
	if err := s.Err(); connect.CodeOf(err) != connect.CodeUnavailable || errMessage(err) != want {
		t.Errorf("stream: %v, want unavailable %q", err, want)
	}
	_ = s.Close()
	if calls.Load() != 0 {
		t.Errorf("the service saw %d calls, want none", calls.Load())
	}
}

// errMessage is a Connect error's message ("" for another error).
func errMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return strings.TrimSpace(ce.Message())
	}
	return ""
}
