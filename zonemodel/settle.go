package zonemodel

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sluicehq/caddy-sluice/identity"
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
	// JSON is the dot path of the amount in a JSON response body, in the
	// data: events of a text/event-stream response, or in the lines of an
	// NDJSON stream (application/x-ndjson); several paths separated by
	// spaces are summed. A term a|b takes the first of its alternatives
	// present (Anthropic's input_tokens: usage.input_tokens in a JSON
	// body, message.usage.input_tokens in a stream's message_start). In a
	// stream each term's last value wins, then the terms are added up.
	// Every term must be told (a stream left before its last term told
	// has no amount), but a term ending in ? counts 0 when absent. E.g.
	// "usage.total_tokens", or "prompt_eval_count? eval_count".
	JSON string `json:"json,omitempty"`

	// Unknown is what a 2xx response whose amount never arrives is charged
	// (the client left before it, the upstream stopped, the amount was
	// unusable): this fixed amount, or with UnknownFrom, that field's
	// value plus this amount; never less than the estimate. Default (both
	// unset): the request's output bound (max_tokens,
	// max_completion_tokens, max_output_tokens) plus its JSON body's
	// length; without a bound, the body's length plus the response's
	// bytes read.
	Unknown int64 `json:"unknown,omitempty"`
	// UnknownFrom is a placeholder whose whole number, plus Unknown, is the
	// charge when the amount never arrives: the request's output bound,
	// {http.rate_limit.request_json.max_tokens}. A request without a
	// usable value is charged as by the default.
	UnknownFrom string `json:"unknown_from,omitempty"`
	// AskUsage: an OpenAI-shaped streamed request that does not ask for
	// usage (stream_options.include_usage) is forwarded asking for it, and
	// the usage event it adds is kept from the client; false forwards the
	// request as it came. Only with a json source. Default: true.
	AskUsage *bool `json:"ask_usage,omitempty"`
	// Free lists the statuses whose estimate is given back whole: codes
	// (503), classes (5xx) and ranges (500-599), or "none" to charge every
	// status. Default: 5xx and 429 (statuses model providers do not bill).
	Free []string `json:"free,omitempty"`
}

// Asks reports whether the zone adds the usage request (AskUsage).
func (s *Settle) Asks() bool { return s.JSON != "" && (s.AskUsage == nil || *s.AskUsage) }

// MaxSettlePath bounds the segments of a settle json path;
// MaxSettleTerms the terms summed; MaxSettlePaths the paths, their
// alternatives included.
const (
	MaxSettlePath  = 16
	MaxSettleTerms = 4
	MaxSettlePaths = 8
)

// DefaultFree is the statuses Free gives back when unset.
var DefaultFree = []string{"5xx", "429"}

// Paths returns the json source's paths, each as its segments, the term
// of the sum each belongs to (a term's alternatives share one), and the
// terms that may be absent (term?), a bit each.
func (s *Settle) Paths() (paths [][]string, terms []int, optional uint8) {
	for t, term := range strings.Fields(s.JSON) {
		if strings.HasSuffix(term, "?") {
			term, optional = term[:len(term)-1], optional|1<<t
		}
		for _, p := range strings.Split(term, "|") {
			paths = append(paths, strings.Split(p, "."))
			terms = append(terms, t)
		}
	}
	return paths, terms, optional
}

// FreeStatuses returns Free, or its default.
func (s *Settle) FreeStatuses() []string {
	switch {
	case s.Free == nil:
		return DefaultFree
	case len(s.Free) == 1 && strings.EqualFold(s.Free[0], "none"):
		return nil
	}
	return s.Free
}

// String renders the source as the Caddyfile writes it.
func (s *Settle) String() string {
	if s.Header != "" {
		return "header " + s.Header
	}
	return "json " + strings.Join(strings.Fields(s.JSON), " ")
}

// checkUnknown checks the charge of a response without an amount.
func (s *Settle) checkUnknown() error {
	if s.Unknown < 0 || s.Unknown > MaxUnknown {
		return fmt.Errorf("settle: unknown must be an amount from 0 to %d, got %d", MaxUnknown, s.Unknown)
	}
	if s.UnknownFrom == "" {
		return nil
	}
	c, err := identity.Compile(s.UnknownFrom)
	if err != nil || c.Placeholders() == nil {
		return fmt.Errorf("settle: unknown %q: write a placeholder and an amount (unknown {%smax_tokens} 1000)", s.UnknownFrom, RequestJSONPrefix)
	}
	if err := checkAmount("settle: unknown", c); err != nil {
		return err
	}
	return nil
}

// MaxUnknown bounds a settle's unknown amount: 2^53, the largest settled.
const MaxUnknown = 1 << 53

// UnknownSpec renders the unknown charge's rule as the Caddyfile writes it
// ("" for the default).
func (s *Settle) UnknownSpec() string {
	switch {
	case s.UnknownFrom != "":
		return fmt.Sprintf("%s %d", s.UnknownFrom, s.Unknown)
	case s.Unknown > 0:
		return fmt.Sprint(s.Unknown)
	}
	return ""
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
		return errors.New("settle: not with count (a settled zone charges every response what it reports; its statuses not charged are settle's free option: settle json usage.total_tokens { free 5xx 429 })")
	case z.LocalAllowance != nil:
		return errors.New("settle: not with local_allowance (a settle must reach the store that holds the key)")
	case (s.Header == "") == (strings.TrimSpace(s.JSON) == ""):
		return errors.New("settle: set one source: header <name> or json <path>")
	case s.Header != "" && strings.ContainsAny(s.Header, " \t\r\n:"):
		return fmt.Errorf("settle: header %q is not a header name", s.Header)
	}
	if err := s.checkUnknown(); err != nil {
		return err
	}
	if s.AskUsage != nil && *s.AskUsage && s.JSON == "" {
		return errors.New("settle: ask_usage applies to a json source (the usage an OpenAI-shaped stream reports)")
	}
	if len(s.Free) > 1 && slices.ContainsFunc(s.Free, func(v string) bool { return strings.EqualFold(v, "none") }) {
		return fmt.Errorf("settle: free %q: none stands alone (charge every status), or list the statuses given back", strings.Join(s.Free, " "))
	}
	terms := strings.Fields(s.JSON)
	if len(terms) > MaxSettleTerms {
		return fmt.Errorf("settle: json %q sums more than %d terms", s.JSON, MaxSettleTerms)
	}
	var paths []string
	for _, term := range terms {
		for _, p := range strings.Split(strings.TrimSuffix(term, "?"), "|") {
			switch {
			case p == "":
				return fmt.Errorf("settle: json %q has an empty alternative: write a|b", s.JSON)
			case strings.Contains(p, "?"):
				return fmt.Errorf("settle: json path %q: a ? ends a term (prompt_eval_count?), which then counts 0 when absent", p)
			}
			paths = append(paths, p)
		}
	}
	if len(paths) > MaxSettlePaths {
		return fmt.Errorf("settle: json %q reads more than %d paths", s.JSON, MaxSettlePaths)
	}
	for i, p := range paths {
		segs := strings.Split(p, ".")
		if len(segs) > MaxSettlePath {
			return fmt.Errorf("settle: json path %q has more than %d segments", p, MaxSettlePath)
		}
		for _, seg := range segs {
			if seg == "" {
				return fmt.Errorf("settle: json path %q has an empty segment: write keys joined by dots (usage.total_tokens)", p)
			}
		}
		if slices.Contains(paths[:i], p) {
			return fmt.Errorf("settle: json path %q is read twice", p)
		}
	}
	return nil
}
