package simulate

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// notes explains what the simulation replaced in the config and which
// placeholders of the zones' keys and costs the traffic cannot give.
func notes(rw *rewritten, zones []*ZoneConfig, kind string, pl *placement) []string {
	var out []string
	for _, z := range zones {
		if z.Dynamic {
			out = append(out, fmt.Sprintf("zone %s: its limit is chosen per request (max_events_from, window_from or burst_from); each resolved limit is a bucket of its own and the table shows the default limit", z.Name))
		}
		if z.model != nil && z.model.Adaptive != nil {
			out = append(out, fmt.Sprintf("zone %s: an adaptive concurrency zone (concurrent adaptive): it cannot be replayed; its limit is learnt from the upstream's latency under overlapping requests, and a log has neither (the replay is sequential): it refuses nothing here", z.Name))
		} else if z.Concurrent > 0 {
			out = append(out, fmt.Sprintf("zone %s: a concurrency zone: the replay is sequential (each request's response is written before the next request arrives), so its slot is given back at once and it refuses nothing; a log gives no overlap of requests to replay", z.Name))
		}
		if !z.Enabled {
			out = append(out, fmt.Sprintf("zone %s: switched off (enabled false): it decides nothing", z.Name))
		}
		for _, f := range []struct {
			what string
			phs  []string
		}{{"key", z.placeholders()}, {"cost", z.costPlaceholders()}} {
			for _, ph := range f.phs {
				if why := unreconstructible(ph, kind, rw, pl); why != "" {
					out = append(out, fmt.Sprintf("zone %s: %s {%s}: %s", z.Name, f.what, ph, why))
				}
			}
		}
	}
	if pl.costSeen && !pl.costUsed {
		out = append(out, "the traffic's cost column (or cost=) is used only by zones whose cost reads a request header, cookie or query argument; no zone here does")
	}
	var kinds []string
	for k, n := range rw.replaced {
		kinds = append(kinds, fmt.Sprintf("%s (%d)", k, n))
	}
	slices.Sort(kinds)
	if len(kinds) > 0 {
		out = append(out, "replaced in the config: "+strings.Join(kinds, ", "))
	}
	if len(rw.untouched) > 0 {
		out = append(out, "handlers run as configured, which the simulator does not know (they may reach the network or the disk): "+strings.Join(rw.untouched, ", "))
	}
	return out
}

// notes says what the replay itself met: requests no zone decided, the
// host given to requests without one when the config has several sites,
// requests out of time order, and why it stopped early.
func (res *passResult) notes(o Options, c SourceCounts, sites []string, host string, tr *traffic) []string {
	var out []string
	if res.stopped != "" {
		out = append(out, "stopped early: "+res.stopped)
	}
	if res.undecided > 0 {
		hint := "give --host to replay every request at one of the config's sites (" + strings.Join(sites, ", ") + ")"
		if len(sites) == 0 {
			hint = "check the routes and the zones' match"
		}
		out = append(out, fmt.Sprintf("%d of %d requests were decided by no zone: they reached no rate_limit handler (no site or route matched them) or no zone's match; hosts tried: %s; paths tried: %s; %s",
			res.undecided, c.Requests, listTried(res.triedHosts, maxTried), listTried(res.triedPaths, maxTried), hint))
	}
	if o.Host == "" && tr.placement.hostDefaulted && len(sites) > 1 {
		out = append(out, fmt.Sprintf("requests without a host (CSV rows, patterns) went to %s, the first of the config's sites (%s); choose another with --host",
			host, strings.Join(sites, ", ")))
	}
	if c.OutOfOrder > 0 {
		were := strconv.FormatInt(c.OutOfOrder, 10) + " requests were"
		if c.OutOfOrder == 1 {
			were = "1 request was"
		}
		out = append(out, were+" out of time order (earlier than a request replayed before them): each was replayed at the latest instant so far, as the virtual clock never runs backwards")
	}
	return out
}

// listTried lists values, saying when there may be more than shown.
func listTried(vs []string, shown int) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = fmt.Sprintf("%q", v)
	}
	s := strings.Join(q, ", ")
	if len(vs) == shown {
		s += ", ..."
	}
	return s
}

// unreconstructible says why a placeholder cannot be had from the traffic
// ("" when it can).
func unreconstructible(ph, kind string, rw *rewritten, pl *placement) string {
	lower := strings.ToLower(ph)
	switch {
	case strings.HasPrefix(ph, "env."):
		return ""
	case ph == "http.vars.client_ip", strings.HasPrefix(ph, "http.request.remote"):
		return ""
	case strings.HasPrefix(ph, "http.request.body"):
		return "request bodies are not in the traffic: empty"
	case strings.HasPrefix(ph, "http.request.tls.client."):
		return "client certificates are not in the traffic: empty"
	case strings.HasPrefix(ph, "http.reverse_proxy."), strings.HasPrefix(ph, "http.response."):
		return "set while proxying or responding, after the decision: empty"
	}
	if kind == "access log" {
		switch {
		case lower == "http.request.header.authorization", lower == "http.request.header.proxy-authorization",
			lower == "http.request.header.cookie", strings.HasPrefix(ph, "http.request.cookie."):
			return "Caddy's access log writes this header as REDACTED unless the server logs credentials (log_credentials): every client looks the same"
		case strings.HasPrefix(ph, "http.request.header."):
			if rw.replaced["forward_auth (reverse_proxy with handle_response): passed through"] > 0 {
				return "as the client sent it; a header that forward_auth copies from the authentication service's answer is not in the log (empty)"
			}
			return ""
		case ph == "http.auth.user.id":
			if rw.hasAuth {
				return ""
			}
			return "no authentication handler in the config sets it (forward_auth, a plugin?): the log's user_id is not used; empty"
		case strings.HasPrefix(ph, "http.auth.user."):
			return "authentication metadata is not in the log: empty"
		case strings.HasPrefix(ph, "http.vars."), strings.HasPrefix(ph, "vars."):
			return "recomputed by the config's vars and map handlers from the logged request; a value set by forward_auth or a plugin is empty"
		case strings.HasPrefix(ph, "http.request."):
			return ""
		}
		return "not a request placeholder the simulator knows: it may be empty"
	}
	// CSV and patterns: the key, the path, the cost, a method and a host.
	switch {
	case strings.HasPrefix(ph, "http.request.header."):
		if slices.Contains(pl.headers, canonical(strings.TrimPrefix(ph, "http.request.header."))) ||
			slices.Contains(pl.costHeaders, canonical(strings.TrimPrefix(ph, "http.request.header."))) {
			return ""
		}
		return "the traffic sets no such header: empty"
	case strings.HasPrefix(ph, "http.request.cookie."), strings.HasPrefix(ph, "http.request.uri.query."):
		return ""
	case strings.HasPrefix(ph, "http.request.uri"), ph == "http.request.method", ph == "http.request.host",
		ph == "http.request.hostport", ph == "http.request.scheme", ph == "http.request.proto":
		return ""
	case ph == "http.auth.user.id":
		if rw.hasAuth {
			return ""
		}
		return "no authentication handler in the config sets it: empty"
	case strings.HasPrefix(ph, "http.vars."), strings.HasPrefix(ph, "vars."):
		return "recomputed by the config's vars and map handlers from the key, path and cost; a value set by forward_auth or a plugin is empty"
	}
	return "not in a " + kind + ": empty"
}

func canonical(h string) string { return http.CanonicalHeaderKey(h) }
