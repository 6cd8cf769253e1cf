package reply

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// phPrefix begins the name of every placeholder this package sets.
const phPrefix = "http.rate_limit."

// The placeholders, named here only (docs/reference.md's table is checked
// against them: TestDocsPlaceholders).
const (
	phExceeded     = phPrefix + "exceeded"
	phZone         = phPrefix + "zone"
	phExceededName = phPrefix + "exceeded.name" // caddy-ratelimit's name for the zone
	phRetryAfter   = phPrefix + "retry_after"
	phLimit        = phPrefix + "limit"
	phRemaining    = phPrefix + "remaining"
	phReset        = phPrefix + "reset"
	phStatus       = phPrefix + "status"
	phError        = phPrefix + "error"
)

// PlaceholderDelay is the time a delay zone held the request, in
// milliseconds, added up over the directives (set by the root package's
// delay.go, not by a refusal).
const PlaceholderDelay = phPrefix + "delay"

// placeholders are the placeholders of a refusal (response.go) and their
// values, with the types Replacer.Set was given before there was a
// provider (strings, int64s, the status as an int), so every placeholder
// renders as it did; pass marks those a forwarded would-be refusal sets
// too (on_exceed pass: SetPassed).
var placeholders = [...]struct {
	name  string
	pass  bool
	value func(Vars) any
}{
	{phExceeded, true, func(Vars) any { return true }},
	{phZone, true, func(p Vars) any { return p.Zone }},
	{phExceededName, true, func(p Vars) any { return p.Zone }},
	{phRetryAfter, true, func(p Vars) any { return p.Retry }},
	{phLimit, true, func(p Vars) any { return p.Limit }},
	{phRemaining, true, func(p Vars) any { return p.Remaining }},
	{phReset, true, func(p Vars) any { return p.Reset }},
	{phStatus, false, func(p Vars) any { return p.Status }},
	{phError, false, func(p Vars) any { return p.Msg }},
}

// Vars are the values of a refusal's placeholders, or (Status and Msg
// unset) of a forwarded would-be refusal's.
type Vars struct {
	Zone                           string
	Retry, Limit, Remaining, Reset int64
	Msg                            string
	Status                         int
}

// get is the placeholder provider: the value of the placeholder key.
func (p Vars) get(key string) (any, bool) {
	if len(key) <= len(phPrefix) || key[:len(phPrefix)] != phPrefix {
		return nil, false
	}
	for i := range placeholders {
		if placeholders[i].name == key {
			return placeholders[i].value(p), true
		}
	}
	return nil, false
}

// Publish makes the refusal's placeholders readable by everything
// that runs after it in the request: the response block's templates, the
// handle_errors routes, handlers that wrap this one (log_append, a deferred
// header) and the access log.
//
// They are served by one provider added to the request's replacer, one
// allocation (the closure holding the values), where setting eight static
// values boxed each value and grew the replacer's map. The provider is asked
// only when a placeholder is read, and formats then.
//
// A provider is asked after the replacer's static values, and two providers
// of one request would answer in the order they were added: in an error
// route, where a rate_limit may refuse a request that an earlier one already
// refused, the values are set as static values instead, so that the latest
// refusal is what the error route reads.
func Publish(r *http.Request, repl *caddy.Replacer, p Vars, marked bool) {
	if _, inErrorRoute := r.Context().Value(caddyhttp.ErrorCtxKey).(error); inErrorRoute || marked {
		for _, ph := range placeholders {
			repl.Set(ph.name, ph.value(p))
		}
		return
	}
	repl.Map(func(key string) (any, bool) { return p.get(key) })
}

// SetPassed publishes the placeholders of a would-be refusal that an
// on_exceed pass zone forwarded, as static values (a later directive
// overwrites them, and its refusal too: see Publish).
func SetPassed(repl *caddy.Replacer, p Vars) {
	for _, ph := range placeholders {
		if ph.pass {
			repl.Set(ph.name, ph.value(p))
		}
	}
}

// SetWithin publishes, unless a directive marked the request already,
// that it is within its limits: {http.rate_limit.exceeded} false and
// {http.rate_limit.zone} empty (known values: header_up and request_header
// would send an unknown placeholder as its literal text).
func SetWithin(repl *caddy.Replacer) {
	if Marked(repl) {
		return
	}
	repl.Set(phExceeded, false)
	repl.Set(phZone, "")
	repl.Set(phExceededName, "")
}

// Marked reports whether the request carries static refusal placeholders
// (SetPassed, SetWithin).
func Marked(repl *caddy.Replacer) bool {
	_, ok := repl.Get(phExceeded)
	return ok
}

// PlaceholderNames are the names of every placeholder of this package.
func PlaceholderNames() []string {
	names := []string{PlaceholderDelay}
	for _, ph := range placeholders {
		names = append(names, ph.name)
	}
	return names
}
