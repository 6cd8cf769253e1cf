package sluice

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
	phDelay        = phPrefix + "delay" // set by a delay zone (delay.go), not by a refusal
)

// placeholders are the placeholders of a refusal (response.go) and their
// values, with the types Replacer.Set was given before there was a
// provider (strings, int64s, the status as an int), so every placeholder
// renders as it did; pass marks those a forwarded would-be refusal sets
// too (on_exceed pass, pass.go).
var placeholders = [...]struct {
	name  string
	pass  bool
	value func(refusalVars) any
}{
	{phExceeded, true, func(refusalVars) any { return true }},
	{phZone, true, func(p refusalVars) any { return p.zone }},
	{phExceededName, true, func(p refusalVars) any { return p.zone }},
	{phRetryAfter, true, func(p refusalVars) any { return p.retry }},
	{phLimit, true, func(p refusalVars) any { return p.limit }},
	{phRemaining, true, func(p refusalVars) any { return p.remaining }},
	{phReset, true, func(p refusalVars) any { return p.reset }},
	{phStatus, false, func(p refusalVars) any { return p.status }},
	{phError, false, func(p refusalVars) any { return p.msg }},
}

// refusalVars are the values of a refusal's placeholders, or (status and
// msg unset) of a forwarded would-be refusal's.
type refusalVars struct {
	zone                           string
	retry, limit, remaining, reset int64
	msg                            string
	status                         int
}

// get is the placeholder provider: the value of the placeholder key.
func (p refusalVars) get(key string) (any, bool) {
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
