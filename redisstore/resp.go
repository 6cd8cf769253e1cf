package redisstore

import (
	"errors"
	"io"
	"strconv"
)

// The decision's reply, read without allocating.
//
// go-redis parses a script's reply into an []any of boxed integers: four
// allocations or more per decision, and the garbage collector's work after
// them. A decision's reply is a small array of integers (a refusal adds the
// time and the zones' stored values for the deny cache), so each call
// instead has go-redis copy its reply's raw RESP bytes into the call's own
// buffer (redis.RawWriteToCmd, reusing the buffer from call to call), and
// reads them here. go-redis still owns the connection, its pool, the
// handshake, Sentinel and Cluster routing; only the reply's decoding is
// ours.

// replyBuf is a call's reply as raw RESP: go-redis writes it, decodeRaw
// reads it.
type replyBuf struct{ b []byte }

// Write appends p (go-redis writes a reply line by line).
func (r *replyBuf) Write(p []byte) (int, error) {
	r.b = append(r.b, p...)
	return len(p), nil
}

// ReadFrom appends what src holds (go-redis copies a bulk string with
// io.CopyN, which uses ReadFrom rather than allocating a 32 KiB buffer).
func (r *replyBuf) ReadFrom(src io.Reader) (int64, error) {
	var n int64
	for {
		if len(r.b) == cap(r.b) {
			r.b = append(r.b, 0)[:len(r.b)]
		}
		m, err := src.Read(r.b[len(r.b):cap(r.b)])
		r.b = r.b[:len(r.b)+m]
		n += int64(m)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// replyError is an error reply of Redis (-ERR …, -NOSCRIPT …, -MOVED …).
// It is a redis.Error, as go-redis's own error replies are, so it is told
// apart from transport errors the same way (a reply decides nothing).
type replyError string

func (e replyError) Error() string { return string(e) }

// RedisError marks replyError as a redis.Error.
func (replyError) RedisError() {}

// errMalformed is the error of a reply that is not RESP as expected.
var errMalformed = errors.New("redis: malformed reply")

// respReader reads one RESP reply from a buffer.
type respReader struct {
	b []byte
	i int
}

// line returns the next line's type byte and its text without the CRLF.
func (r *respReader) line() (byte, []byte, error) {
	b := r.b[r.i:]
	for j := 1; j+1 < len(b); j++ {
		if b[j] == '\r' && b[j+1] == '\n' {
			r.i += j + 2
			return b[0], b[1:j], nil
		}
	}
	return 0, nil, errMalformed
}

// atoi parses a RESP integer.
func atoi(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
		if len(b) == 0 {
			return 0, false
		}
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// errorReply returns the error of an error reply of type t (a simple or a
// blob error), or nil for any other type.
func (r *respReader) errorReply(t byte, body []byte) error {
	switch t {
	case '-':
		return replyError(body)
	case '!':
		n, ok := atoi(body)
		if !ok || n < 0 || r.i+int(n)+2 > len(r.b) {
			return errMalformed
		}
		e := replyError(r.b[r.i : r.i+int(n)])
		r.i += int(n) + 2
		return e
	}
	return nil
}

// arrayLen reads an array's header: its length, or an error reply's error.
func (r *respReader) arrayLen() (int, error) {
	t, body, err := r.line()
	if err != nil {
		return 0, err
	}
	if err := r.errorReply(t, body); err != nil {
		return 0, err
	}
	switch t {
	case '*':
		n, ok := atoi(body)
		if !ok || n < -1 {
			return 0, errMalformed
		}
		return int(n), nil
	case '_':
		return -1, nil
	case '$':
		if string(body) == "-1" { // RESP2's nil
			return -1, nil
		}
	}
	return 0, &typeError{t}
}

// value reads one scalar: an integer (int64), a bulk or simple string
// (string), or nil. A string is the reply's only allocation (refusals
// only: the zones' stored values for the deny cache).
func (r *respReader) value() (any, error) {
	t, body, err := r.line()
	if err != nil {
		return nil, err
	}
	switch t {
	case ':':
		n, ok := atoi(body)
		if !ok {
			return nil, errMalformed
		}
		return n, nil
	case '$':
		n, ok := atoi(body)
		if !ok || n < -1 {
			return nil, errMalformed
		}
		if n == -1 {
			return nil, nil
		}
		if r.i+int(n)+2 > len(r.b) {
			return nil, errMalformed
		}
		s := string(r.b[r.i : r.i+int(n)])
		r.i += int(n) + 2
		return s, nil
	case '+':
		return string(body), nil
	case '_':
		return nil, nil
	}
	if err := r.errorReply(t, body); err != nil {
		return nil, err
	}
	return nil, &typeError{t}
}

// integer reads an integer; anything else is an error naming its type.
func (r *respReader) integer() (int64, error) {
	t, body, err := r.line()
	if err != nil {
		return 0, err
	}
	if t != ':' {
		if err := r.errorReply(t, body); err != nil {
			return 0, err
		}
		return 0, &typeError{t}
	}
	n, ok := atoi(body)
	if !ok {
		return 0, errMalformed
	}
	return n, nil
}

// appendRESP appends v, a reply as go-redis parses it, as RESP: decodeRaw
// then reads a typed command's reply as it reads a raw one. A type the
// script never returns is written as one decodeRaw refuses.
func appendRESP(b []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(b, "_\r\n"...)
	case int64:
		return append(strconv.AppendInt(append(b, ':'), v, 10), "\r\n"...)
	case string:
		b = append(strconv.AppendInt(append(b, '$'), int64(len(v)), 10), "\r\n"...)
		return append(append(b, v...), "\r\n"...)
	case []any:
		b = append(strconv.AppendInt(append(b, '*'), int64(len(v)), 10), "\r\n"...)
		for _, e := range v {
			b = appendRESP(b, e)
		}
		return b
	}
	return append(b, "?\r\n"...)
}

// typeError is the error of a reply element of an unexpected type.
type typeError struct{ t byte }

func (e *typeError) Error() string {
	return "redis: the script returned a RESP " + strconv.QuoteRune(rune(e.t)) + " where an integer or an array was expected"
}
