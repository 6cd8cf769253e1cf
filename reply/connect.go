package reply

import (
	"encoding/binary"
	"net/http"
	"strconv"
	"strings"
)

// Connect refusals (docs/protocols.md): a refused call of the Connect
// protocol (connectrpc.com) is answered in Connect's error shape, so that
// the client sees resource_exhausted, not the unavailable it reads from a
// bare 429. A unary call (Content-Type application/proto, or any
// application/* with Connect-Protocol-Version: 1, or a GET with connect=v1
// in its query) gets the HTTP status of the code and a JSON error body; a
// streaming call (application/connect+*) gets HTTP 200 and one
// end-of-stream message carrying the error.

// Connect's error codes for a refusal (Connect protocol, "Error Codes":
// HTTP 429 and 503 for a unary call).
const (
	connectResourceExhausted = "resource_exhausted"
	connectUnavailable       = "unavailable"
)

// connectEndStream is the flags byte of a streaming response's
// end-of-stream message.
const connectEndStream = 0x02

// connectCall reports whether r is a Connect call and, for a streaming
// one, the Content-Type its answer echoes.
func connectCall(r *http.Request) (ok bool, streamCT string) {
	if r.Method == http.MethodGet {
		return connectGet(r.URL.RawQuery), ""
	}
	ct := r.Header.Get("Content-Type")
	const app, stream = "application/", "application/connect+"
	if len(ct) > len(stream) && strings.EqualFold(ct[:len(stream)], stream) {
		return true, ct
	}
	if r.Header.Get("Connect-Protocol-Version") == "1" && len(ct) > len(app) && strings.EqualFold(ct[:len(app)], app) {
		return true, ""
	}
	base, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(base), "application/proto"), ""
}

// refuseConnect answers a refused Connect call (see above) and reports
// whether r was one; hs holds the refusal's headers gathered so far (the
// rate limit headers, Retry-After), which the answer carries. A
// fail-closed refusal (Unavailable) is unavailable, HTTP 503 for a unary
// call.
func refuseConnect(w http.ResponseWriter, r *http.Request, hs *headerSet, f *Refusal) bool {
	ok, streamCT := connectCall(r)
	if !ok {
		return false
	}
	code, msg, status := connectResourceExhausted, MsgExceeded, http.StatusTooManyRequests
	if f.Unavailable {
		code, msg, status = connectUnavailable, MsgUnavailable, http.StatusServiceUnavailable
	}
	b := make([]byte, 5, 128) // room for a streaming message's envelope
	if streamCT != "" {
		b = append(b, `{"error":`...)
	}
	b = append(b, `{"code":"`...)
	b = append(b, code...)
	b = append(b, `","message":"`...)
	b = append(b, msg...)
	b = append(b, " in zone "...)
	b = append(b, f.JSONZone...)
	if !f.Unavailable {
		b = append(b, " (limit "...)
		b = strconv.AppendInt(b, f.Limit, 10)
		b = append(b, ')')
	}
	b = append(b, `"}`...)
	hdr := w.Header()
	hs.set(hdr)
	if streamCT == "" {
		hdr.Set(HeaderContentType, "application/json")
		hdr.Set("Content-Length", strconv.Itoa(len(b)-5))
		w.WriteHeader(status)
		_, _ = w.Write(b[5:])
		return true
	}
	b = append(b, '}')
	b[0] = connectEndStream
	binary.BigEndian.PutUint32(b[1:5], uint32(len(b)-5))
	hdr.Set(HeaderContentType, streamCT)
	hdr.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
	return true
}

// connectGet reports whether a GET's query is a unary Connect call's
// (connect=v1 among its parameters), without parsing it.
func connectGet(q string) bool {
	for q != "" {
		var p string
		p, q, _ = strings.Cut(q, "&")
		if p == "connect=v1" {
			return true
		}
	}
	return false
}
