package sluice

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/usage"
)

// requestJSONControl: a zone's key, cost and settle's unknown charge may
// read a field of the request's JSON body,
// `{http.rate_limit.request_json.<path>}` (the model of an OpenAI-style
// request: {http.rate_limit.request_json.model}; its max_tokens). Before the
// zones are planned, the first requestJSONMax bytes of a JSON request body
// are read, the string or whole number at each path used is set as that
// placeholder (empty when absent, or beyond the bound), and the body is
// handed on whole to the next handlers. Only a directive whose zones use
// the placeholder reads bodies.
var requestJSONControl = control{
	name:      "request json",
	compile:   compileRequestJSON,
	provision: provisionRequestJSON,
	hooks:     hooks{prepare: readRequestJSON},
}

// requestJSONPrefix is the placeholders' prefix; requestJSONMax the most
// of a body read for them.
const (
	requestJSONPrefix = "http.rate_limit.request_json."
	requestJSONMax    = 64 << 10
)

// requestJSONZone is the control's part of a zone: the paths of the
// request's JSON body its key, cost and settle's unknown charge read.
type requestJSONZone struct{ paths []string }

// requestJSONDirective is the control's part of a directive: every path its
// zones read, each once; none, and no body is read.
type requestJSONDirective struct{ paths []string }

// compileRequestJSON collects the request JSON paths the zone reads: in
// its key, its cost and its settle's unknown charge.
func compileRequestJSON(z *zone, cfg *Zone) error {
	fields := []struct{ name, v string }{{"cost", string(cfg.Cost)}}
	if cfg.Settle != nil {
		fields = append(fields, struct{ name, v string }{"settle", cfg.Settle.UnknownFrom})
	}
	for _, k := range cfg.Key {
		fields = append(fields, struct{ name, v string }{"key", k})
	}
	for _, f := range fields {
		for rest := f.v; ; {
			i := strings.Index(rest, "{"+requestJSONPrefix)
			if i < 0 {
				break
			}
			rest = rest[i+1+len(requestJSONPrefix):]
			path, _, ok := strings.Cut(rest, "}")
			if !ok || path == "" || strings.Contains(path, "..") {
				return fmt.Errorf("%s: {%s%s}: write a dot path of keys ({%smodel})", f.name, requestJSONPrefix, path, requestJSONPrefix)
			}
			if !containsString(z.requestJSON.paths, path) {
				z.requestJSON.paths = append(z.requestJSON.paths, path)
			}
		}
	}
	return nil
}

// provisionRequestJSON gathers the paths of every zone: the directive reads
// request bodies only when some zone uses one.
func provisionRequestJSON(h *Handler) (stages, error) {
	h.requestJSON.paths = nil
	for _, z := range h.zones {
		for _, p := range z.requestJSON.paths {
			if !containsString(h.requestJSON.paths, p) {
				h.requestJSON.paths = append(h.requestJSON.paths, p)
			}
		}
	}
	if len(h.requestJSON.paths) == 0 {
		return 0, nil
	}
	return joins(atPrepare), nil
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// readRequestJSON reads up to requestJSONMax bytes of a JSON request body,
// sets each path's placeholder from them, and puts the bytes back in front
// of the rest of the body.
func readRequestJSON(a *admission) error {
	r := a.r
	if r.Body == nil || r.Body == http.NoBody || !isJSON(r.Header.Get("Content-Type")) {
		return nil
	}
	buf := make([]byte, requestJSONMax)
	n, err := io.ReadFull(r.Body, buf)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return nil // the next handler sees the same error reading on
	}
	buf = buf[:n]
	r.Body = readCloser{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	var s usage.Scan
	for _, p := range a.h.requestJSON.paths {
		s.Reset(strings.Split(p, "."), true)
		s.Feed(buf)
		s.End()
		v := ""
		if text, isText := s.Text(); s.Found() && isText {
			v = string(text)
		} else if s.Found() {
			v = strconv.FormatInt(s.Value(), 10)
		}
		repl.Set(requestJSONPrefix+p, v)
	}
	return nil
}

// isJSON reports whether a Content-Type is JSON (application/json, or a
// +json type).
func isJSON(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	ct = strings.ToLower(strings.TrimSpace(ct))
	return ct == "application/json" || strings.HasSuffix(ct, "+json")
}

// readCloser reads from one reader and closes another (the original body).
type readCloser struct {
	io.Reader
	io.Closer
}
