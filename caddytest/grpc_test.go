package caddytest_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// grpcApp is the gRPC service behind Caddy: grpc-go's interop TestService,
// counting the calls that reach it. A server stream sends one message and
// then holds the call open until release is closed; a bidi stream echoes
// until the client closes its side.
type grpcApp struct {
	testpb.UnimplementedTestServiceServer
	mu      sync.Mutex
	arrived []time.Time // each unary call's arrival
	streams atomic.Int64
	release chan struct{}
}

func (a *grpcApp) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	a.mu.Lock()
	a.arrived = append(a.arrived, time.Now())
	a.mu.Unlock()
	return &testpb.SimpleResponse{}, nil
}

func (a *grpcApp) StreamingOutputCall(_ *testpb.StreamingOutputCallRequest, s testpb.TestService_StreamingOutputCallServer) error {
	a.streams.Add(1)
	if err := s.Send(&testpb.StreamingOutputCallResponse{}); err != nil {
		return err
	}
	select {
	case <-a.release:
	case <-s.Context().Done():
	}
	return nil
}

func (a *grpcApp) FullDuplexCall(s testpb.TestService_FullDuplexCallServer) error {
	a.streams.Add(1)
	for {
		if _, err := s.Recv(); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if err := s.Send(&testpb.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
}

func (a *grpcApp) calls() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.arrived...)
}

// startGRPCApp serves a grpcApp over h2c on a free loopback port.
func startGRPCApp(t *testing.T) (*grpcApp, string) {
	t.Helper()
	app := &grpcApp{release: make(chan struct{})}
	s := grpc.NewServer()
	testpb.RegisterTestServiceServer(s, app)
	return app, serveGRPC(t, s)
}

// serveGRPC serves s over h2c on a free loopback port until the test ends,
// and returns its address.
func serveGRPC(t *testing.T, s *grpc.Server) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

// tlsGlobal serves the test sites with the protocols @PROTOCOLS@: an
// http:// site on port A and, on port B, TLS with a certificate from
// Caddy's internal CA (QUIC, for h3, on UDP port B).
const tlsGlobal = `{
	admin localhost:@ADMIN@
	persist_config off
	http_port @A@
	https_port @B@
	auto_https disable_redirects
	local_certs
	skip_install_trust
	default_bind 127.0.0.1
	storage file_system @STORAGE@
	servers {
		protocols @PROTOCOLS@
	}
}
`

// grpcSites is a plain-text site on port A and a TLS site on port B, both
// in front of the gRPC app at @APP@ through reverse_proxy (h2c upstream),
// with the rate_limit block @LIMIT@.
//
// Calls whose request body ends with their one message are proxied with
// the body read whole first (request_buffers): Caddy v2.11.9's
// reverse_proxy races, as -race reports, on a request body it is still
// reading when the upstream's answer ends (bodyNopCloserIfNotRead), which
// a gRPC server's quick answer to a unary call makes frequent. The bidi
// stream, whose body cannot be read whole first, goes unbuffered.
const grpcSites = `
(proxy) {
	@bidi path /grpc.testing.TestService/FullDuplexCall
	reverse_proxy @bidi h2c://@APP@
	reverse_proxy h2c://@APP@ {
		request_buffers 64KiB
	}
}

http://localhost:@A@ {
	rate_limit {
		@LIMIT@
	}
	import proxy
}

https://localhost:@B@ {
	tls internal
	rate_limit {
		@LIMIT@
	}
	import proxy
}
`

// grpcConfig renders tlsGlobal (h1, h2, h2c) and grpcSites.
func grpcConfig(app, limit string, vars ...string) string {
	pairs := []string{"@STORAGE@", storageDir, "@ADMIN@", strconv.Itoa(adminPort), "@A@", strconv.Itoa(portA), "@B@", strconv.Itoa(portB), "@APP@", app, "@LIMIT@", limit, "@PROTOCOLS@", "h1 h2 h2c"}
	pairs = append(pairs, vars...)
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.HasPrefix(pairs[i], "@") {
			pairs[i] = "@" + pairs[i] + "@"
		}
	}
	r := strings.NewReplacer(pairs...)
	out := r.Replace(r.Replace(tlsGlobal + grpcSites))
	if v := unreplaced.FindString(out); v != "" {
		panic("grpcConfig: unreplaced variable " + v + " in:\n" + out)
	}
	return out
}

// grpcTransports are the two ways the tests reach Caddy: h2c on port A,
// TLS (internal CA, not verified) on port B.
var grpcTransports = []struct {
	name string
	port func() int
	cred func() credentials.TransportCredentials
}{
	{"h2c", func() int { return portA }, insecure.NewCredentials},
	{"tls", func() int { return portB }, func() credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, ServerName: "localhost"})
	}},
}

// attempts counts a client's attempts (each retry is one) and when each
// began, through grpc-go's stats handler, which sees every attempt.
type attempts struct {
	mu    sync.Mutex
	begun []time.Time
}

func (a *attempts) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (a *attempts) HandleRPC(_ context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.Begin); ok {
		a.mu.Lock()
		a.begun = append(a.begun, time.Now())
		a.mu.Unlock()
	}
}
func (a *attempts) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (a *attempts) HandleConn(context.Context, stats.ConnStats)                       {}

func (a *attempts) times() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.begun...)
}

// retryPolicy retries RESOURCE_EXHAUSTED up to 5 attempts with a 10ms
// backoff: a retry much later than 10ms was held back by the pushback.
const retryPolicy = `{"methodConfig":[{"name":[{"service":"grpc.testing.TestService"}],
	"retryPolicy":{"maxAttempts":5,"initialBackoff":"0.01s","maxBackoff":"0.01s","backoffMultiplier":1,
	"retryableStatusCodes":["RESOURCE_EXHAUSTED"]}}]}`

// dialGRPC connects a grpc-go client to Caddy on port with creds, with the
// retry policy when retry is set, and the attempt counter a when not nil.
func dialGRPC(t *testing.T, port int, creds credentials.TransportCredentials, retry bool, a *attempts) (testpb.TestServiceClient, *grpc.ClientConn) {
	t.Helper()
	if port == portB {
		waitTLS(t)
	}
	// The sites match the host localhost.
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithAuthority("localhost")}
	if retry {
		opts = append(opts, grpc.WithDefaultServiceConfig(retryPolicy))
	} else {
		opts = append(opts, grpc.WithDisableRetry())
	}
	if a != nil {
		opts = append(opts, grpc.WithStatsHandler(a))
	}
	cc, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(port), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return testpb.NewTestServiceClient(cc), cc
}

// waitTLS waits until the TLS site on port B has its certificate (Caddy's
// internal CA issues it in the background after a load).
func waitTLS(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", "127.0.0.1:"+strconv.Itoa(portB),
			&tls.Config{InsecureSkipVerify: true, ServerName: "localhost", NextProtos: []string{"h2"}})
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the TLS site on port %d never completed a handshake: %v", portB, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// asUser sends the calls of ctx with x-user: user (the zones' key).
func asUser(ctx context.Context, user string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-user", user)
}

// TestGRPCRefusalExact: 20 concurrent unary calls of one user against
// events 5 per hour, over h2c and over TLS, with the memory store and with
// Redis: the gRPC service receives exactly 5; the other 15 end with
// RESOURCE_EXHAUSTED (code 8) and a message naming the zone and its limit.
func TestGRPCRefusalExact(t *testing.T) {
	app, appAddr := startGRPCApp(t)
	for _, store := range grpcStores(t) {
		z := zoneName("grpc_exact_" + store.name)
		load(t, newTester(t), grpcConfig(appAddr, `zone @ZONE@ {
			key {http.request.header.X-User}
			events 5
			window 1h
		}
		@STORE@`, "ZONE", z, "STORE", store.block))
		for _, tr := range grpcTransports {
			t.Run(store.name+"/"+tr.name, func(t *testing.T) {
				client, _ := dialGRPC(t, tr.port(), tr.cred(), false, nil)
				ctx := asUser(context.Background(), "u-"+nonce+"-"+store.name+"-"+tr.name)
				before := len(app.calls())
				const calls = 20
				codesSeen := make([]codes.Code, calls)
				msgs := make([]string, calls)
				var wg sync.WaitGroup
				for i := range calls {
					wg.Add(1)
					go func() {
						defer wg.Done()
						cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
						defer cancel()
						_, err := client.UnaryCall(cctx, &testpb.SimpleRequest{})
						st := status.Convert(err)
						codesSeen[i], msgs[i] = st.Code(), st.Message()
					}()
				}
				wg.Wait()
				ok, exhausted := 0, 0
				for i, c := range codesSeen {
					switch c {
					case codes.OK:
						ok++
					case codes.ResourceExhausted:
						exhausted++
						if want := "rate limit exceeded in zone " + z + " (limit 5)"; msgs[i] != want {
							t.Errorf("refused call's message %q, want %q", msgs[i], want)
						}
					default:
						t.Errorf("call %d: code %v (%q), want OK or ResourceExhausted", i, c, msgs[i])
					}
				}
				reached := len(app.calls()) - before
				t.Logf("%s over %s: %d OK, %d RESOURCE_EXHAUSTED, %d reached the service", store.name, tr.name, ok, exhausted, reached)
				if ok != 5 || exhausted != 15 || reached != 5 {
					t.Errorf("got %d OK, %d RESOURCE_EXHAUSTED, %d reached the service; want 5, 15, 5", ok, exhausted, reached)
				}
			})
		}
	}
}

// grpcStores are the stores the gRPC tests run on, as the directive's
// store line: the memory store, and a Redis started for the test.
func grpcStores(t *testing.T) []struct{ name, block string } {
	srv := redistest.Start(t)
	return []struct{ name, block string }{
		{"memory", ""},
		{"redis", "store redis " + srv.URL() + " {\n\t\t\ttimeout 2s\n\t\t}"},
	}
}

// grpcPost sends one gRPC (or gRPC-Web) request by hand with content type
// ct, X-User: user and the further header name/value pairs more through c
// and returns the response (with its trailers) and its body.
func grpcPost(t *testing.T, c *http.Client, url, ct, user string, more ...string) (*http.Response, string) {
	t.Helper()
	// An empty message: the 5-byte length prefix of a zero-length frame.
	req, err := http.NewRequest(http.MethodPost, url+"/grpc.testing.TestService/UnaryCall", strings.NewReader("\x00\x00\x00\x00\x00"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ct)
	req.Header.Set("Te", "trailers")
	req.Header.Set("X-User", user)
	for i := 0; i+1 < len(more); i += 2 {
		req.Header.Set(more[i], more[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", ct, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// TestGRPCWireShape: the refusal on the wire, read with a plain HTTP/2
// client: HTTP 200, trailers-only (the status in the headers of a response
// with no body and no trailers), grpc-retry-pushback-ms with the wait, the
// rate limit headers (draft fields when enabled) and Retry-After; 14 with
// grpc_status unavailable; -1 (do not retry) for a zone with a penalty;
// gRPC-Web (application/grpc-web+proto, over HTTP/1.1) the same way; a
// request that is not gRPC still gets the 429.
func TestGRPCWireShape(t *testing.T) {
	_, appAddr := startGRPCApp(t)
	h2 := &http.Transport{Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	defer h2.CloseIdleConnections()
	h2c := &http.Client{Transport: h2, Timeout: 10 * time.Second}
	h1 := loopbackClient(2)
	defer h1.CloseIdleConnections()

	z, zp := zoneName("grpc_wire"), zoneName("grpc_penalty")
	load(t, newTester(t), grpcConfig(appAddr, `zone @ZONE@ {
			key {http.request.header.X-User}
			events 1
			window 10s
		}
		zone @PZONE@ {
			key {http.request.header.X-Penalized}
			match {
				header X-Penalized *
			}
			events 1
			window 10s
			penalty 1m
		}
		headers both`, "ZONE", z, "PZONE", zp))

	user := "u-" + nonce
	resp, body := grpcPost(t, h2c, siteA, "application/grpc", user)
	if resp.StatusCode != 200 || resp.Header.Get("Grpc-Status") != "" {
		t.Fatalf("first call: %d %v, want the service's answer", resp.StatusCode, resp.Header)
	}
	resp, body = grpcPost(t, h2c, siteA, "application/grpc", user)
	t.Logf("refused: %s %d %v body %q trailers %v", resp.Proto, resp.StatusCode, resp.Header, body, resp.Trailer)
	checkGRPCRefusal(t, resp, body, "application/grpc", "8", "rate limit exceeded in zone "+z+" (limit 1)")
	pushback, err := strconv.Atoi(resp.Header.Get("Grpc-Retry-Pushback-Ms"))
	if err != nil || pushback < 9000 || pushback > 10000 {
		t.Errorf("grpc-retry-pushback-ms %q: want the refill of one event (10s/1), 9000..10000 ms", resp.Header.Get("Grpc-Retry-Pushback-Ms"))
	}
	if resp.ProtoMajor != 2 {
		t.Errorf("answered over %s, want HTTP/2", resp.Proto)
	}
	for _, name := range []string{"X-Ratelimit-Limit", "Ratelimit-Policy", "Ratelimit", "Retry-After"} {
		if resp.Header.Get(name) == "" {
			t.Errorf("refusal lacks %s: %v", name, resp.Header)
		}
	}

	// gRPC-Web over HTTP/1.1: the same trailers-only answer, in headers.
	resp, body = grpcPost(t, h1, siteA, "application/grpc-web+proto", user)
	checkGRPCRefusal(t, resp, body, "application/grpc-web+proto", "8", "rate limit exceeded in zone "+z+" (limit 1)")

	// Not gRPC: the ordinary 429.
	r := expect(t, get(t, h1, siteA+"/", "X-User: "+user), 429, "a plain GET of the same user")
	if r.header.Get("Grpc-Status") != "" {
		t.Errorf("a plain request got gRPC headers: %v", r.header)
	}

	// A penalty: do not retry.
	pu := "p-" + nonce
	if resp, _ := grpcPost(t, h2c, siteA, "application/grpc", pu, "X-Penalized", pu); resp.Header.Get("Grpc-Status") != "" {
		t.Fatalf("penalty zone, first call: %v, want the service's answer", resp.Header)
	}
	resp, body = grpcPost(t, h2c, siteA, "application/grpc", pu, "X-Penalized", pu)
	checkGRPCRefusal(t, resp, body, "application/grpc", "8", "rate limit exceeded in zone "+zp+" (limit 1)")
	if got := resp.Header.Get("Grpc-Retry-Pushback-Ms"); got != "-1" {
		t.Errorf("penalty refusal: grpc-retry-pushback-ms %q, want -1 (do not retry)", got)
	}

	// grpc_status unavailable: code 14.
	zu := zoneName("grpc_unavailable")
	load(t, newTester(t), grpcConfig(appAddr, `zone @ZONE@ {
			key {http.request.header.X-User}
			events 1
			window 10s
		}
		grpc_status unavailable`, "ZONE", zu))
	h2.CloseIdleConnections()
	grpcPost(t, h2c, siteA, "application/grpc", user)
	resp, body = grpcPost(t, h2c, siteA, "application/grpc", user)
	checkGRPCRefusal(t, resp, body, "application/grpc", "14", "rate limit exceeded in zone "+zu+" (limit 1)")
}

func checkGRPCRefusal(t *testing.T, resp *http.Response, body, ct, code, msg string) {
	t.Helper()
	if resp.StatusCode != 200 {
		t.Errorf("status %d, want 200 (gRPC carries its status in grpc-status)", resp.StatusCode)
	}
	if got := resp.Header.Get("Content-Type"); got != ct {
		t.Errorf("Content-Type %q, want %q", got, ct)
	}
	if got := resp.Header.Get("Grpc-Status"); got != code {
		t.Errorf("grpc-status %q, want %s", got, code)
	}
	if got := resp.Header.Get("Grpc-Message"); got != msg {
		t.Errorf("grpc-message %q, want %q", got, msg)
	}
	if resp.Header.Get("Grpc-Retry-Pushback-Ms") == "" {
		t.Error("no grpc-retry-pushback-ms")
	}
	if body != "" || len(resp.Trailer) != 0 {
		t.Errorf("body %q, trailers %v: want neither (trailers-only)", body, resp.Trailer)
	}
}

// TestGRPCPushback: a grpc-go client whose retry policy retries
// RESOURCE_EXHAUSTED after 10ms waits the pushback instead. One event per
// 800ms: the first call passes; the second, sent at once, is refused with a
// pushback of about 800ms, and its retry reaches the service no earlier
// (its one retry passes: two attempts, not more). A zone with a penalty
// sends "do not retry": one attempt only.
func TestGRPCPushback(t *testing.T) {
	app, appAddr := startGRPCApp(t)
	z, zp := zoneName("grpc_pushback"), zoneName("grpc_pushback_penalty")
	load(t, newTester(t), grpcConfig(appAddr, `zone @ZONE@ {
			key {http.request.header.X-User}
			events 1
			window 800ms
		}
		zone @PZONE@ {
			key {http.request.header.X-Penalized}
			match {
				header X-Penalized *
			}
			events 1
			window 800ms
			penalty 1m
		}`, "ZONE", z, "PZONE", zp))
	for _, tr := range grpcTransports {
		t.Run(tr.name, func(t *testing.T) {
			var a attempts
			client, _ := dialGRPC(t, tr.port(), tr.cred(), true, &a)
			ctx, cancel := context.WithTimeout(asUser(context.Background(), "u-"+nonce+"-"+tr.name), 10*time.Second)
			defer cancel()
			before := len(app.calls())
			if _, err := client.UnaryCall(ctx, &testpb.SimpleRequest{}); err != nil {
				t.Fatalf("first call: %v", err)
			}
			if _, err := client.UnaryCall(ctx, &testpb.SimpleRequest{}); err != nil {
				t.Fatalf("second call (retried): %v", err)
			}
			calls, begun := app.calls()[before:], a.times()
			if len(calls) != 2 || len(begun) != 3 {
				t.Fatalf("the service saw %d calls and the client made %d attempts; want 2 and 3 (the second call refused once, then let in)", len(calls), len(begun))
			}
			// The first call is charged between its attempt's start and its
			// arrival at the service, so the refill is due 800ms after a
			// moment no earlier than begun[0]: the retry may begin, and
			// reach the service, no sooner (10ms: the clocks' rounding).
			gap, retryAfter := calls[1].Sub(begun[0]), begun[2].Sub(begun[0])
			t.Logf("%s: second call reached the service %v after the first call began; its retry began %v after it (%v after its refused attempt)", tr.name, gap, retryAfter, begun[2].Sub(begun[1]))
			if gap < 790*time.Millisecond || gap > 3*time.Second {
				t.Errorf("the second call reached the service %v after the first began, want 790ms..3s (the refill of one event, 800ms)", gap)
			}
			if retryAfter < 790*time.Millisecond {
				t.Errorf("the retry began %v after the first call began: the pushback (the refill, 800ms) was not waited", retryAfter)
			}

			// Penalty: -1, so the client gives up at once.
			var pa attempts
			pclient, _ := dialGRPC(t, tr.port(), tr.cred(), true, &pa)
			pu := "p-" + nonce + "-" + tr.name
			pctx, pcancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "x-user", pu, "x-penalized", pu), 10*time.Second)
			defer pcancel()
			if _, err := pclient.UnaryCall(pctx, &testpb.SimpleRequest{}); err != nil {
				t.Fatalf("penalty zone, first call: %v", err)
			}
			start := time.Now()
			_, err := pclient.UnaryCall(pctx, &testpb.SimpleRequest{})
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("penalty zone, second call: %v, want ResourceExhausted", err)
			}
			if n := len(pa.times()); n != 2 || time.Since(start) > time.Second {
				t.Errorf("penalty zone: %d attempts in all, the refused call took %v; want 2 (no retry), at once", n, time.Since(start))
			}
		})
	}
}

// TestGRPCStreamsHoldSlots: a concurrency zone (concurrent 2) holds a slot
// for each open stream, server stream and bidi alike, and frees it when
// the stream ends: with two streams open a third call is refused with
// RESOURCE_EXHAUSTED; ending either lets the next one in.
func TestGRPCStreamsHoldSlots(t *testing.T) {
	app, appAddr := startGRPCApp(t)
	for _, store := range grpcStores(t) {
		z := zoneName("grpc_streams_" + store.name)
		load(t, newTester(t), grpcConfig(appAddr, `zone @ZONE@ {
			key {http.request.header.X-User}
			concurrent 2
		}
		@STORE@`, "ZONE", z, "STORE", store.block))
		for _, tr := range grpcTransports {
			grpcStreamsHoldSlots(t, app, z, store.name, tr.name, tr.port(), tr.cred())
		}
	}
}

// grpcStreamsHoldSlots is TestGRPCStreamsHoldSlots over one store and one
// transport.
func grpcStreamsHoldSlots(t *testing.T, app *grpcApp, z, storeName, trName string, port int, cred credentials.TransportCredentials) {
	t.Run(storeName+"/"+trName, func(t *testing.T) {
		client, _ := dialGRPC(t, port, cred, false, nil)
		ctx, cancel := context.WithTimeout(asUser(context.Background(), "s-"+nonce+"-"+storeName+"-"+trName), 20*time.Second)
		defer cancel()
		app.release = make(chan struct{})
		streamsBefore := app.streams.Load()

		// Slot 1: a server stream, open until the app releases it.
		ss, err := client.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ss.Recv(); err != nil {
			t.Fatalf("server stream: %v", err)
		}
		// Slot 2: a bidi stream, open until the client closes it.
		bidi, err := client.FullDuplexCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := bidi.Send(&testpb.StreamingOutputCallRequest{}); err != nil {
			t.Fatal(err)
		}
		if _, err := bidi.Recv(); err != nil {
			t.Fatalf("bidi: %v", err)
		}
		refused := func(what string) {
			t.Helper()
			_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
			if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), z) {
				t.Errorf("%s: %v, want ResourceExhausted naming %s", what, err, z)
			}
		}
		// passes: a slot freed by a stream's end is given back once Caddy
		// has seen the end (with Redis, asynchronously, after the client
		// has): a call refused meanwhile spends nothing.
		passes := func(what string) {
			t.Helper()
			deadline := time.Now().Add(3 * time.Second)
			for {
				_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
				if err == nil {
					return
				}
				if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
					t.Errorf("%s: %v, want OK", what, err)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		refused("a unary call with two streams open")
		// A third stream is refused too, before it reaches the app.
		s3, err := client.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
		if err == nil {
			_, err = s3.Recv()
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a third stream: %v, want ResourceExhausted", err)
		}

		// The bidi stream ends (the client closes its side): one slot.
		if err := bidi.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := bidi.Recv(); err != io.EOF {
			t.Fatalf("bidi end: %v", err)
		}
		passes("a unary call after the bidi stream ended")
		// Hold the free slot with a second bidi stream: full again (once
		// the unary call's slot is back, as in passes).
		var bidi2 testpb.TestService_FullDuplexCallClient
		for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if bidi2, err = client.FullDuplexCall(ctx); err != nil {
				t.Fatal(err)
			}
			if err := bidi2.Send(&testpb.StreamingOutputCallRequest{}); err != nil {
				t.Fatal(err)
			}
			_, err = bidi2.Recv()
			if err == nil {
				break
			}
			if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
				t.Fatalf("bidi 2: %v", err)
			}
		}
		refused("a unary call with the server stream and a new bidi stream open")

		// The server stream ends (the app returns): one slot again.
		close(app.release)
		if _, err := ss.Recv(); err != io.EOF {
			t.Fatalf("server stream end: %v", err)
		}
		passes("a unary call after the server stream ended")
		_ = bidi2.CloseSend()
		if _, err := bidi2.Recv(); err != io.EOF {
			t.Fatalf("bidi 2 end: %v", err)
		}
		passes("a unary call with no stream open")
		if n := app.streams.Load() - streamsBefore; n != 3 {
			t.Errorf("the app saw %d streams, want 3 (the refused one never reached it)", n)
		}
	})
}

// TestGRPCFailClosed: a zone with fail closed whose Redis cannot be reached
// answers a gRPC call UNAVAILABLE (code 14), whatever grpc_status says,
// with a pushback of Retry-After's wait (a second; once the breaker is
// open, the rest of its cool-down); and an unknown grpc_status is refused
// at load, naming the field.
func TestGRPCFailClosed(t *testing.T) {
	_, appAddr := startGRPCApp(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close() // nothing listens there now
	z := zoneName("grpc_fail_closed")
	load(t, newTester(t), grpcConfig(appAddr, `zone @ZONE@ {
			key {http.request.header.X-User}
			events 5
			window 1m
			fail closed
		}
		store redis redis://@DEAD@ {
			timeout 50ms
			breaker {
				failures 3
				cooldown 4s
			}
		}`, "ZONE", z, "DEAD", dead))
	for _, tr := range grpcTransports {
		t.Run(tr.name, func(t *testing.T) {
			var a attempts
			client, _ := dialGRPC(t, tr.port(), tr.cred(), true, &a)
			ctx, cancel := context.WithTimeout(asUser(context.Background(), "f-"+nonce), 10*time.Second)
			defer cancel()
			_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
			st := status.Convert(err)
			if st.Code() != codes.Unavailable || st.Message() != "rate limiter unavailable in zone "+z {
				t.Errorf("fail closed: %v, want Unavailable %q", err, "rate limiter unavailable in zone "+z)
			}
			// UNAVAILABLE is not in the retry policy: one attempt.
			if n := len(a.times()); n != 1 {
				t.Errorf("%d attempts, want 1", n)
			}
		})
	}
	h2 := &http.Transport{Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	defer h2.CloseIdleConnections()
	resp, body := grpcPost(t, &http.Client{Transport: h2, Timeout: 10 * time.Second}, siteA, "application/grpc", "f-"+nonce)
	checkGRPCRefusal(t, resp, body, "application/grpc", "14", "rate limiter unavailable in zone "+z)
	if got := resp.Header.Get("Grpc-Retry-Pushback-Ms"); got != "1000" {
		t.Errorf("fail closed: grpc-retry-pushback-ms %q, want 1000 (Retry-After: 1)", got)
	}
	// Three failures in a row opened the breaker: the pushback is what is
	// left of its cool-down (Redis is not asked before then).
	resp, body = grpcPost(t, &http.Client{Transport: h2, Timeout: 10 * time.Second}, siteA, "application/grpc", "f-"+nonce)
	checkGRPCRefusal(t, resp, body, "application/grpc", "14", "rate limiter unavailable in zone "+z)
	if ms, err := strconv.Atoi(resp.Header.Get("Grpc-Retry-Pushback-Ms")); err != nil || ms <= 2000 || ms > 4000 {
		t.Errorf("breaker open: grpc-retry-pushback-ms %q, want the rest of the 4s cool-down", resp.Header.Get("Grpc-Retry-Pushback-Ms"))
	}
	if ra := resp.Header.Get("Retry-After"); ra != "3" && ra != "4" {
		t.Errorf("breaker open: Retry-After %q, want the rest of the 4s cool-down in seconds", ra)
	}

	expectLoadRefused(t, config("", `http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			events 5
			window 1m
		}
		grpc_status not_found
	}
	respond "ok"
}
`, "ZONE", zoneName("grpc_bad")), "text/caddyfile", "grpc_status", "not_found")
}

// TestGRPCWaitingRoomFull: a delay zone with max_waiting 1. A first call
// spends the burst; a second waits for its turn (1s away), holding the one
// place; a third, which would wait too, finds the room full and is refused
// at once with RESOURCE_EXHAUSTED naming the zone; the second then passes.
func TestGRPCWaitingRoomFull(t *testing.T) {
	app, appAddr := startGRPCApp(t)
	z := zoneName("grpc_room")
	load(t, newTester(t), grpcConfig(appAddr, `zone @ZONE@ {
			key {http.request.header.X-User}
			events 1
			window 1s
			burst 1
			delay 5s
		}
		max_waiting 1`, "ZONE", z))
	client, _ := dialGRPC(t, portA, insecure.NewCredentials(), false, nil)
	ctx, cancel := context.WithTimeout(asUser(context.Background(), "room-"+nonce), 10*time.Second)
	defer cancel()
	before := len(app.calls())
	if _, err := client.UnaryCall(ctx, &testpb.SimpleRequest{}); err != nil {
		t.Fatalf("first call: %v", err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
		waited <- err
	}()
	_, ok := waitForCond(2*time.Second, func() bool { return gauge(t, "caddy_rate_limit_waiting") == 1 })
	if !ok {
		t.Fatal("the second call never waited")
	}
	start := time.Now()
	_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || st.Message() != "rate limit exceeded in zone "+z+" (limit 1)" {
		t.Errorf("a call with the waiting room full: %v, want ResourceExhausted naming %s", err, z)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("the refusal took %v, want it at once", d)
	}
	if err := <-waited; err != nil {
		t.Errorf("the waiting call: %v, want OK", err)
	}
	if n := len(app.calls()) - before; n != 2 {
		t.Errorf("the service saw %d calls, want 2", n)
	}
}
