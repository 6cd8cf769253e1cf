package redisstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// TLS: the store's own CA and client certificate (tls_ca, tls_cert,
// tls_key: a private CA, mutual TLS as managed Redis offers), and a dialer
// that tells a failed handshake from an outage: it completes the handshake
// and one PING round trip (a TLS 1.3 server refuses a client certificate
// only after the client thinks the handshake done, on its first read), and
// wraps what fails there in a *tlsError: nothing was sent, no decision is
// unknown.

// tlsError is a connection whose TLS handshake failed.
type tlsError struct {
	addr string
	err  error
}

func (e *tlsError) Error() string {
	return "redis: TLS handshake with " + e.addr + " failed (no decision sent): " + e.err.Error()
}
func (e *tlsError) Unwrap() error { return e.err }

// tlsFiles reads the CA and the client certificate into c (a resolved
// configuration), naming the field whose file fails.
func (c *connConfig) tlsFiles(ca, cert, key string) error {
	var err error
	if ca != "" {
		if c.CA, err = os.ReadFile(ca); err != nil {
			return fmt.Errorf("store redis: tls_ca: %v", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(c.CA) {
			return fmt.Errorf("store redis: tls_ca %s: no PEM certificate in it", ca)
		}
	}
	if cert != "" {
		if c.Cert, err = os.ReadFile(cert); err != nil {
			return fmt.Errorf("store redis: tls_cert: %v", err)
		}
		if c.Key, err = os.ReadFile(key); err != nil {
			return fmt.Errorf("store redis: tls_key: %v", err)
		}
		if _, err := tls.X509KeyPair(c.Cert, c.Key); err != nil {
			return fmt.Errorf("store redis: tls_cert %s and tls_key %s: %v", cert, key, err)
		}
	}
	return nil
}

// tlsDialer applies the CA and the client certificate to base (go-redis's,
// from the URL; nil: the store's default) and returns the dialer that
// reports a failed handshake as such.
func (c *connConfig) tlsDialer(base *tls.Config, dialTimeout time.Duration) (*tls.Config, func(ctx context.Context, network, addr string) (net.Conn, error)) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if base != nil {
		cfg = base.Clone()
	}
	if len(c.CA) > 0 {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(c.CA)
		cfg.RootCAs = pool
	}
	if len(c.Cert) > 0 {
		pair, err := tls.X509KeyPair(c.Cert, c.Key) // checked at Provision
		if err == nil {
			cfg.Certificates = []tls.Certificate{pair}
		}
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cc := cfg
		if cc.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			cc = cfg.Clone()
			cc.ServerName = host
		}
		conn := tls.Client(raw, cc)
		if err := handshake(ctx, conn, dialTimeout); err != nil {
			_ = raw.Close()
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || ctx.Err() != nil {
				return nil, err // a server that does not answer: an outage
			}
			return nil, &tlsError{addr: addr, err: err}
		}
		return conn, nil
	}
	return cfg, dial
}

// handshake runs conn's handshake and a PING round trip, whose reply
// (PONG, or NOAUTH before the connection authenticates) proves the server
// accepted the handshake.
func handshake(ctx context.Context, conn *tls.Conn, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	if err := conn.HandshakeContext(ctx); err != nil {
		return err
	}
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	var b [1]byte
	for {
		if _, err := conn.Read(b[:]); err != nil {
			return err
		}
		if b[0] == '\n' {
			return nil
		}
	}
}
