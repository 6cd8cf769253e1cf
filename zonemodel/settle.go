package zonemodel

import (
	"errors"
	"fmt"
	"strings"
)

// Settle is where a zone reads the actual amount a request spent, once its
// response tells (a rate zone's `settle`): the request takes its cost (the
// estimate) before it runs, and the zone is then settled to the amount
// read: the difference given back, or charged on top (a key may go into
// debt). Exactly one source is set.
type Settle struct {
	// Header is a response header holding the amount (a whole number), or
	// a trailer of that name when the header is absent. E.g.
	// "X-Usage-Tokens".
	Header string `json:"header,omitempty"`
	// JSON is the dot path of the amount in a JSON response body, or in
	// the data: events of a text/event-stream response (the last event
	// carrying it wins). E.g. "usage.total_tokens".
	JSON string `json:"json,omitempty"`
}

// MaxSettlePath bounds the segments of a settle json path.
const MaxSettlePath = 16

// Path returns the json source's segments.
func (s *Settle) Path() []string {
	if s.JSON == "" {
		return nil
	}
	return strings.Split(s.JSON, ".")
}

// String renders the source as the Caddyfile writes it.
func (s *Settle) String() string {
	if s.Header != "" {
		return "header " + s.Header
	}
	return "json " + s.JSON
}

// checkSettle checks a zone's settle source and what it combines with.
func (z *Zone) checkSettle() error {
	s := z.Settle
	if s == nil {
		return nil
	}
	switch {
	case z.IsConcurrency():
		return errors.New("settle does not apply to a concurrency zone (concurrent): it holds slots, not units; settle a rate zone of its own")
	case len(z.Count) > 0:
		return errors.New("settle: not with count (a settled zone charges every response what it reports; a response without an amount keeps the estimate)")
	case z.LocalAllowance != nil:
		return errors.New("settle: not with local_allowance (a settle must reach the store that holds the key)")
	case (s.Header == "") == (s.JSON == ""):
		return errors.New("settle: set one source: header <name> or json <path>")
	case s.Header != "" && strings.ContainsAny(s.Header, " \t\r\n:"):
		return fmt.Errorf("settle: header %q is not a header name", s.Header)
	}
	if s.JSON != "" {
		segs := s.Path()
		if len(segs) > MaxSettlePath {
			return fmt.Errorf("settle: json path %q has more than %d segments", s.JSON, MaxSettlePath)
		}
		for _, seg := range segs {
			if seg == "" {
				return fmt.Errorf("settle: json path %q has an empty segment: write keys joined by dots (usage.total_tokens)", s.JSON)
			}
		}
	}
	return nil
}
