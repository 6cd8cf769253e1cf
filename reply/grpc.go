package reply

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// gRPC refusals (docs/protocols.md): a refused call whose request is gRPC
// (Content-Type application/grpc...) or gRPC-Web (application/grpc-web...)
// is answered the way a gRPC server answers a failed call, so that the
// client's status and its retry policy see the limit: HTTP 200,
// trailers-only (grpc-status, grpc-message and grpc-retry-pushback-ms in
// the one HEADERS frame that ends the stream), no body.

// gRPC status names accepted by Settings.GRPCStatus, and their codes.
const (
	grpcResourceExhausted = "resource_exhausted"
	grpcUnavailable       = "unavailable"

	grpcCodeResourceExhausted = "8"
	grpcCodeUnavailable       = "14"
)

// Headers of a gRPC answer (canonical forms, as the header map keys them).
const (
	hdrGRPCStatus   = "Grpc-Status"
	hdrGRPCMessage  = "Grpc-Message"
	hdrGRPCPushback = "Grpc-Retry-Pushback-Ms"
)

// grpcNoRetry is the pushback that tells a gRPC client not to retry: any
// negative number (gRPC proposal A6, "Pushback").
const grpcNoRetry = "-1"

// CheckGRPCStatus checks the status name of a refused gRPC call.
func CheckGRPCStatus(status string) error {
	switch status {
	case "", grpcResourceExhausted, grpcUnavailable:
		return nil
	}
	return fmt.Errorf("grpc_status: unknown status %q (known: %s, %s)", status, grpcResourceExhausted, grpcUnavailable)
}

// grpcContentType returns the Content-Type of the gRPC answer to r: r's own
// for gRPC-Web (application/grpc-web, -web+proto, -web-text), which reads
// the status from the response headers of a trailers-only answer too;
// application/grpc for gRPC; "" when r is not a gRPC request.
func grpcContentType(r *http.Request) string {
	ct := r.Header.Get("Content-Type")
	if len(ct) < len("application/grpc") || !strings.EqualFold(ct[:len("application/grpc")], "application/grpc") {
		return ""
	}
	if rest := ct[len("application/grpc"):]; rest != "" && rest[0] != '+' && rest[0] != ';' && rest[0] != '-' {
		return "" // application/grpcfoo: not gRPC
	}
	if strings.HasPrefix(strings.ToLower(ct), "application/grpc-web") {
		return ct
	}
	return "application/grpc"
}

// refuseGRPC answers a refused gRPC call (see above) and reports whether r
// was one; hs holds the refusal's headers gathered so far (the rate limit
// headers, Retry-After), which the answer carries. A fail-closed refusal
// (Unavailable) is UNAVAILABLE whatever GRPCStatus says.
func (s *Shape) refuseGRPC(w http.ResponseWriter, r *http.Request, hs *headerSet, f *Refusal) bool {
	ct := grpcContentType(r)
	if ct == "" {
		return false
	}
	hdr := w.Header()
	hs.set(hdr)
	code, msg := grpcCodeResourceExhausted, MsgExceeded
	if s.grpcUnavailable {
		code = grpcCodeUnavailable
	}
	if f.Unavailable {
		code, msg = grpcCodeUnavailable, MsgUnavailable
	}
	pushback := grpcNoRetry
	if !f.Penalized {
		pushback = strconv.FormatInt(s.pushbackMillis(f.RetryAfter), 10)
	}
	b := make([]byte, 0, 96)
	b = append(b, msg...)
	b = append(b, " in zone "...)
	b = append(b, f.Zone...)
	if !f.Unavailable {
		b = append(b, " (limit "...)
		b = strconv.AppendInt(b, f.Limit, 10)
		b = append(b, ')')
	}
	hdr.Set(HeaderContentType, ct)
	hdr.Set(hdrGRPCStatus, code)
	hdr.Set(hdrGRPCMessage, string(appendGRPCPercentEncoded(nil, string(b))))
	hdr.Set(hdrGRPCPushback, pushback)
	w.WriteHeader(http.StatusOK)
	return true
}

// pushbackMillis is grpc-retry-pushback-ms for a refusal whose request
// could pass after d: milliseconds rounded up, at least 1, with the
// configured jitter added as for Retry-After, and at most 2^31-1 (clients
// may read it as a 32-bit number).
func (s *Shape) pushbackMillis(d time.Duration) int64 {
	d = s.jittered(d)
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return min(max(1, int64(ms)), math.MaxInt32)
}

// appendGRPCPercentEncoded appends s as grpc-message carries it: bytes
// outside printable ASCII, and '%', as %XX (gRPC over HTTP/2, "Responses").
func appendGRPCPercentEncoded(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '%' {
			b = append(b, '%', hex[c>>4], hex[c&15])
			continue
		}
		b = append(b, c)
	}
	return b
}
