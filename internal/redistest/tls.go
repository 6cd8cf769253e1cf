package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// TLSFiles are PEM files a test generates for itself: a CA, a server
// certificate it signed for 127.0.0.1, a client certificate it signed, and
// a second CA that signed nothing of these (to verify against and fail).
type TLSFiles struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
	OtherCA                                          string
}

// NewTLSFiles writes a fresh set of TLSFiles in a temporary directory.
func NewTLSFiles(t testing.TB) *TLSFiles {
	t.Helper()
	dir := t.TempDir()
	f := &TLSFiles{}
	ca, caKey := selfSigned(t, "redistest CA")
	other, _ := selfSigned(t, "redistest other CA")
	f.CA = writePEM(t, dir, "ca.pem", "CERTIFICATE", ca.Raw)
	f.OtherCA = writePEM(t, dir, "other-ca.pem", "CERTIFICATE", other.Raw)
	f.ServerCert, f.ServerKey = leaf(t, dir, "server", ca, caKey, x509.ExtKeyUsageServerAuth)
	f.ClientCert, f.ClientKey = leaf(t, dir, "client", ca, caKey, x509.ExtKeyUsageClientAuth)
	return f
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("redistest: key: %v", err)
	}
	return k
}

var serials atomic.Int64

func nextSerial() *big.Int { return big.NewInt(time.Now().UnixNano() + serials.Add(1)) }

func selfSigned(t testing.TB, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	k := newKey(t)
	tpl := &x509.Certificate{
		SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &k.PublicKey, k)
	if err != nil {
		t.Fatalf("redistest: CA: %v", err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("redistest: CA: %v", err)
	}
	return c, k
}

func leaf(t testing.TB, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage) (cert, key string) {
	t.Helper()
	k := newKey(t)
	tpl := &x509.Certificate{
		SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: "redistest " + name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &k.PublicKey, caKey)
	if err != nil {
		t.Fatalf("redistest: %s certificate: %v", name, err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatalf("redistest: %s key: %v", name, err)
	}
	return writePEM(t, dir, name+".pem", "CERTIFICATE", der), writePEM(t, dir, name+"-key.pem", "EC PRIVATE KEY", kder)
}

func writePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return p
}

// StartTLS starts a standalone redis-server that also listens for TLS on
// a second free port (TLSAddr), with f's server certificate, and that
// requires a client certificate signed by f's CA (tls-auth-clients yes).
// Its plain port stays open, for the helpers (Do, Info).
func StartTLS(t testing.TB, f *TLSFiles, extraConfig ...string) *Server {
	t.Helper()
	return startNode(t, "redis-server", func(s *Server) []string {
		s.TLSPort = FreePort(t)
		s.TLSAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.TLSPort))
		return append([]string{
			"tls-port " + strconv.Itoa(s.TLSPort),
			"tls-cert-file " + quoteConf(f.ServerCert),
			"tls-key-file " + quoteConf(f.ServerKey),
			"tls-ca-cert-file " + quoteConf(f.CA),
			"tls-auth-clients yes",
		}, extraConfig...)
	})
}
