package reply

import (
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// ParseResponse parses the rate_limit directive's `response handle_errors`, `response problem` with
// an optional block of status and header, or a response block.
func ParseResponse(d *caddyfile.Dispenser) (*Response, error) {
	r := new(Response)
	if d.NextArg() {
		switch d.Val() {
		case "handle_errors":
			r.HandleErrors = true
		case "problem":
			r.Problem = true
		default:
			return nil, d.Errf("rate_limit: response: unknown mode %q (known: handle_errors, problem), or write a block", d.Val())
		}
		if d.NextArg() {
			return nil, d.ArgErr()
		}
		if r.HandleErrors && d.NextBlock(d.Nesting()) {
			return nil, d.Err("rate_limit: response handle_errors takes no block: shape the response in handle_errors")
		}
		if r.HandleErrors {
			return r, nil
		}
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		field := d.Val()
		if field != "header" {
			if seen[field] {
				return nil, d.Errf("rate_limit: response: duplicate %s", field)
			}
			seen[field] = true
		}
		switch field {
		case "status":
			v, err := oneArg(d, "rate_limit: response: status")
			if err != nil {
				return nil, err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 { // 0 would read as not set
				return nil, d.Errf("rate_limit: response: status must be a positive integer, got %q", v)
			}
			r.StatusCode = n
		case "content_type":
			v, err := oneArg(d, "rate_limit: response: content_type")
			if err != nil {
				return nil, err
			}
			r.ContentType = v
		case "body":
			v, err := oneArg(d, "rate_limit: response: body")
			if err != nil {
				return nil, err
			}
			r.Body = v
		case "header":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return nil, d.Err("rate_limit: response: header needs a name and a value")
			}
			if r.Headers == nil {
				r.Headers = map[string][]string{}
			}
			r.Headers[args[0]] = append(r.Headers[args[0]], args[1])
		default:
			return nil, d.Errf("rate_limit: response: unknown option %q (known: status, content_type, body, header)", field)
		}
	}
	if len(seen) == 0 && r.Headers == nil && !r.Problem {
		return nil, d.Err("rate_limit: response needs a block, handle_errors or problem")
	}
	return r, nil
}

// oneArg reads exactly one argument for what.
func oneArg(d *caddyfile.Dispenser, what string) (string, error) {
	if !d.NextArg() {
		return "", d.Errf("%s needs a value", what)
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.Errf("%s takes one value, got also %q", what, d.Val())
	}
	return v, nil
}
