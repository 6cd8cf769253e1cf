package caddytest_test

import (
	"context"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// shopService is the example's gRPC service, registered by hand (no
// generated code): shop.v1.Catalog/Search and /Get (unary, counted), and
// shop.v1.Orders/Watch, a server stream that sends one message and stays
// open until release is closed.
type shopService struct {
	calls   atomic.Int64
	release chan struct{}
}

func (s *shopService) register(srv *grpc.Server) {
	unary := func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		var in emptypb.Empty
		if err := dec(&in); err != nil {
			return nil, err
		}
		s.calls.Add(1)
		// Answering at once would let Caddy v2.11.9's reverse_proxy still
		// be reading the request body's end when the answer ends, a race
		// -race reports (bodyNopCloserIfNotRead; grpc_test.go's grpcSites
		// buffers instead, but the example is proxied as written).
		time.Sleep(5 * time.Millisecond)
		return &emptypb.Empty{}, nil
	}
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "shop.v1.Catalog",
		HandlerType: (*any)(nil),
		Methods:     []grpc.MethodDesc{{MethodName: "Search", Handler: unary}, {MethodName: "Get", Handler: unary}},
	}, struct{}{})
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "shop.v1.Orders",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Watch", ServerStreams: true, Handler: func(_ any, st grpc.ServerStream) error {
			var in emptypb.Empty
			if err := st.RecvMsg(&in); err != nil {
				return err
			}
			if err := st.SendMsg(&emptypb.Empty{}); err != nil {
				return err
			}
			select {
			case <-s.release:
			case <-st.Context().Done():
			}
			return nil
		}}},
	}, struct{}{})
}

// testExampleGRPC checks what examples/grpc.Caddyfile's comment promises,
// with grpc-go: without an upstream the stand-in answers UNIMPLEMENTED,
// naming the method; in front of a real service, a client's 100 units a
// minute are 9 searches (10 each) and 10 other calls, the next call is
// refused RESOURCE_EXHAUSTED naming the zone, with the service having seen
// exactly 19 calls; and a client holds at most 2 Watch streams open, a
// third refused until one ends. load loads the example (loadExample).
func testExampleGRPC(t *testing.T, load func(t *testing.T, env, renames map[string]string)) {
	api, streams := zoneName("api"), zoneName("streams")
	renames := map[string]string{"api": api, "streams": streams}
	invoke := func(cc *grpc.ClientConn, key, method string) error {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "x-api-key", key), 10*time.Second)
		defer cancel()
		return cc.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{})
	}

	// The stand-in: the variable unset (restored after the test).
	t.Setenv("SLUICE_GRPC_UPSTREAM", "")
	os.Unsetenv("SLUICE_GRPC_UPSTREAM")
	load(t, nil, renames)
	// Asked with a body-less gRPC request, not grpc-go's: an upstream that
	// answers before reading the request body (as the stand-in does) races
	// in Caddy v2.11.9's reverse_proxy (bodyNopCloserIfNotRead, seen by
	// -race), which a real gRPC service, reading the body first, avoids.
	h2 := &http.Transport{Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	defer h2.CloseIdleConnections()
	// The stand-in listens on 127.0.0.1:9089, as protect.Caddyfile's does:
	// for a moment after a reload the previous configuration's server may
	// still accept there (Caddy stops old servers after the load returns),
	// so a proxied call is asked again, a bounded number of times, while
	// it reaches another example's stand-in.
	var resp *http.Response
	for try := 0; ; try++ {
		req, err := http.NewRequest(http.MethodPost, siteA+"/shop.v1.Catalog/Search", http.NoBody)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("X-Api-Key", "k_stand_"+nonce)
		if resp, err = (&http.Client{Transport: h2, Timeout: 10 * time.Second}).Do(req); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Header.Get("Grpc-Status") != "" || try == 20 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if resp.Header.Get("Grpc-Status") != "12" || resp.Header.Get("Grpc-Message") != "the stand-in gRPC service: /shop.v1.Catalog/Search" {
		t.Errorf("the stand-in: %d %v, want grpc-status 12 (UNIMPLEMENTED) naming the method", resp.StatusCode, resp.Header)
	}

	// A real service.
	shop := &shopService{release: make(chan struct{})}
	srv := grpc.NewServer()
	shop.register(srv)
	addr := serveGRPC(t, srv)
	api, streams = zoneName("api"), zoneName("streams")
	renames = map[string]string{"api": api, "streams": streams}
	load(t, map[string]string{"SLUICE_GRPC_UPSTREAM": addr}, renames)
	_, cc := dialGRPC(t, portA, insecure.NewCredentials(), false, nil)
	key := "k_" + nonce
	for i := range 9 {
		if err := invoke(cc, key, "/shop.v1.Catalog/Search"); err != nil {
			t.Fatalf("search %d: %v", i+1, err)
		}
	}
	for i := range 10 {
		if err := invoke(cc, key, "/shop.v1.Catalog/Get"); err != nil {
			t.Fatalf("get %d: %v", i+1, err)
		}
	}
	err := invoke(cc, key, "/shop.v1.Catalog/Get")
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || st.Message() != "rate limit exceeded in zone "+api+" (limit 100)" {
		t.Errorf("the call after 100 units: %v, want ResourceExhausted naming %s", err, api)
	}
	if n := shop.calls.Load(); n != 19 {
		t.Errorf("the service saw %d calls, want 19", n)
	}

	watch := func(key string) (grpc.ClientStream, error) {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "x-api-key", key)
		s, err := cc.NewStream(ctx, &grpc.StreamDesc{StreamName: "Watch", ServerStreams: true}, "/shop.v1.Orders/Watch")
		if err != nil {
			return nil, err
		}
		if err := s.SendMsg(&emptypb.Empty{}); err != nil {
			return nil, err
		}
		if err := s.CloseSend(); err != nil {
			return nil, err
		}
		return s, s.RecvMsg(&emptypb.Empty{})
	}
	wkey := "w_" + nonce
	for i := range 2 {
		if _, err := watch(wkey); err != nil {
			t.Fatalf("watch %d: %v", i+1, err)
		}
	}
	_, err = watch(wkey)
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), streams) {
		t.Errorf("a third watch: %v, want ResourceExhausted naming %s", err, streams)
	}
	close(shop.release) // the two streams end
	deadline := time.Now().Add(3 * time.Second)
	for {
		_, err := watch(wkey)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a watch after the streams ended: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("zones %s and %s: 19 calls of 100 units passed, the 20th refused; 2 watches open, the third refused until they ended", api, streams)
}
