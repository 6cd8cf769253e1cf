package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
	"github.com/sluicehq/caddy-sluice/stores"
)

// TestTLSPrivateCAAndClientCertificate: against a redis-server that
// requires a client certificate (tls-auth-clients yes), with a CA the test
// made: the store with tls_ca, tls_cert and tls_key decides, exactly; one
// without the client certificate, or trusting another CA, fails with the
// error kind tls and an error that says the handshake failed (not an
// unknown decision: nothing was sent).
func TestTLSPrivateCAAndClientCertificate(t *testing.T) {
	f := redistest.NewTLSFiles(t)
	srv := redistest.StartTLS(t, f)
	url := "rediss://" + srv.TLSAddr

	t.Run("mutual TLS", func(t *testing.T) {
		m := provision(t, &Redis{URL: url, TLSCA: f.CA, TLSCert: f.ClientCert, TLSKey: f.ClientKey})
		req := algorithms.Request{Zone: "tls", Key: freshKey(t), Limit: limit(t, 3, time.Hour, 0), Cost: 1}
		allowed := 0
		for range 5 {
			if moduleTake(t, m, req).Allowed {
				allowed++
			}
		}
		if allowed != 3 {
			t.Fatalf("%d of 5 allowed, want 3", allowed)
		}
	})
	for _, tc := range []struct {
		name string
		m    *Redis
		want string
	}{
		{"no client certificate", &Redis{URL: url, TLSCA: f.CA}, ""},
		{"another CA", &Redis{URL: url, TLSCA: f.OtherCA, TLSCert: f.ClientCert, TLSKey: f.ClientKey}, "certificate signed by unknown authority"},
		{"the system's roots", &Redis{URL: url}, "certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := provision(t, tc.m)
			unknown := testutil.ToFloat64(m.Store.unknown)
			req := algorithms.Request{Zone: "tls", Key: freshKey(t), Limit: limit(t, 3, time.Hour, 0), Cost: 1}
			for i := range 3 {
				err := m.Take(context.Background(), []algorithms.Request{req}, make([]algorithms.Decision, 1))
				var k stores.ErrorKind
				if i == 0 && (!errors.As(err, &k) || k.StoreErrorKind() != "tls" ||
					!strings.Contains(err.Error(), "TLS handshake") || !strings.Contains(err.Error(), tc.want)) {
					t.Fatalf("Take: %v; want an error of kind tls saying the handshake failed (%s)", err, tc.want)
				}
				if err == nil || strings.Contains(err.Error(), "decision unknown") {
					t.Fatalf("Take %d: %v", i, err)
				}
			}
			if got := testutil.ToFloat64(m.Store.unknown); got != unknown {
				t.Fatalf("%v unknown decisions counted for failed handshakes", got-unknown)
			}
		})
	}
}

// TestTLSOptionsChecked: the Caddyfile takes tls_ca, tls_cert and tls_key;
// a certificate without its key, a file that is not there, or TLS files
// without TLS are refused, naming the field.
func TestTLSOptionsChecked(t *testing.T) {
	f := redistest.NewTLSFiles(t)
	var r Redis
	d := caddyfile.NewTestDispenser("redis rediss://127.0.0.1:1 {\n tls_ca " + f.CA + "\n tls_cert " + f.ClientCert + "\n tls_key " + f.ClientKey + "\n}")
	if err := r.UnmarshalCaddyfile(d); err != nil || r.TLSCA != f.CA || r.TLSCert != f.ClientCert || r.TLSKey != f.ClientKey {
		t.Fatalf("UnmarshalCaddyfile: %v, %+v", err, r)
	}
	d = caddyfile.NewTestDispenser("redis rediss://127.0.0.1:1 {\n tls_cert " + f.ClientCert + "\n}")
	if err := new(Redis).UnmarshalCaddyfile(d); err == nil || !strings.Contains(err.Error(), "tls_key") {
		t.Fatalf("a certificate without its key: %v", err)
	}
	for _, tc := range []struct {
		m    *Redis
		want string
	}{
		{&Redis{URL: "redis://127.0.0.1:1", TLSCA: f.CA}, "need TLS"},
		{&Redis{URL: "rediss://127.0.0.1:1", TLSCA: f.CA + ".missing"}, "tls_ca"},
		{&Redis{URL: "rediss://127.0.0.1:1", TLSCA: f.ClientKey}, "tls_ca"},
		{&Redis{URL: "rediss://127.0.0.1:1", TLSCert: f.ClientCert, TLSKey: f.ServerKey}, "tls_cert"},
	} {
		err := tc.m.Provision(caddyContext(t))
		if err == nil {
			_ = tc.m.Cleanup()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%+v: Provision: %v; want an error naming %s", tc.m, err, tc.want)
		}
	}
}

// TestTLSSentinelDial: a Sentinel store's connections (dialled by its
// promotion guard, failover.go) go through the store's TLS dial: with the
// CA and client certificate they reach a TLS server; without the
// certificate the dial fails as a handshake.
func TestTLSSentinelDial(t *testing.T) {
	f := redistest.NewTLSFiles(t)
	srv := redistest.StartTLS(t, f)
	for _, tc := range []struct {
		name      string
		cert, key string
		handshake bool
	}{{"mutual TLS", f.ClientCert, f.ClientKey, false}, {"no client certificate", "", "", true}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := connConfig{URL: "rediss+sentinel://" + srv.TLSAddr + "?master_name=mymaster", Timeout: testTimeout}
			if err := cfg.tlsFiles(f.CA, tc.cert, tc.key); err != nil {
				t.Fatal(err)
			}
			c, _, err := cfg.newClient()
			if err != nil {
				t.Fatal(err)
			}
			g := takeGuard(c)
			defer closeClient(c)
			if g == nil || g.tlsDial == nil {
				t.Fatal("the Sentinel client's guard has no TLS dial")
			}
			conn, err := g.netDial(context.Background(), "tcp", srv.TLSAddr)
			if conn != nil {
				conn.Close()
			}
			if got := errors.As(err, new(*tlsError)); got != tc.handshake || !tc.handshake && err != nil {
				t.Fatalf("dial: %v; want a handshake error: %v", err, tc.handshake)
			}
		})
	}
}

// TestTLSClusterDial: a Cluster store with tls dials its nodes through the
// store's TLS dial, with tls_ca and the client certificate.
func TestTLSClusterDial(t *testing.T) {
	f := redistest.NewTLSFiles(t)
	srv := redistest.StartTLS(t, f)
	for _, tc := range []struct {
		name      string
		cert, key string
		handshake bool
	}{{"mutual TLS", f.ClientCert, f.ClientKey, false}, {"no client certificate", "", "", true}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := connConfig{Cluster: []string{srv.TLSAddr}, TLS: true, Timeout: testTimeout}
			if err := cfg.tlsFiles(f.CA, tc.cert, tc.key); err != nil {
				t.Fatal(err)
			}
			c, _, err := cfg.newClient()
			if err != nil {
				t.Fatal(err)
			}
			defer closeClient(c)
			dial := c.(*redis.ClusterClient).Options().Dialer
			if dial == nil {
				t.Fatal("the Cluster client has no TLS dial")
			}
			conn, err := dial(context.Background(), "tcp", srv.TLSAddr)
			if conn != nil {
				conn.Close()
			}
			if got := errors.As(err, new(*tlsError)); got != tc.handshake || !tc.handshake && err != nil {
				t.Fatalf("dial: %v; want a handshake error: %v", err, tc.handshake)
			}
		})
	}
}
