package algorithms

import (
	"strconv"
	"strings"
)

// This file reads a key's state back without charging it, for the admin
// API: Peek computes what a key shows now, and DecodeLua turns a value the
// Lua twin stored in Redis into the State the Go twin would hold, so that a
// Redis key can be peeked with Step and Redis's own time, without running
// (and so without writing through) the decision script.

// Peek returns what a key shows at now without charging it: Limit,
// Remaining and ResetAfter as the state stands (Step with cost 0), and, for
// a request of cost 1, whether it would pass now (Allowed) and if not, the
// earliest time from now it could (RetryAfter). fresh reports that the key
// has no state. Peek never writes to st.
func Peek(st State, fresh bool, l Limit, now int64) Decision {
	d, _, _ := Step(st, fresh, l, now, 0)
	if d.Remaining >= 1 {
		// Every algorithm admits a cost of 1 exactly when at least 1
		// remains (and a step that admits would append to a sliding log).
		d.Allowed, d.RetryAfter = true, 0
		return d
	}
	one, _, _ := Step(st, fresh, l, now, 1) // refused: a refusal writes nothing
	d.Allowed, d.RetryAfter = one.Allowed, one.RetryAfter
	return d
}

// DecodeLua parses a state as the Lua twin stores it (see lua/*.lua):
//
//	token bucket    "<debt>:<at>:<scale>"
//	gcra            "g<at>:<fraction>:<unit>"
//	fixed window    "f<count>:<start>:<length>"
//	sliding window  "s<prev>:<cur>:<start>:<window>"
//	sliding log     "l<base>" then ",<t-base>" or ",<t-base>*<cost>" per event
//
// The State it returns carries the algorithm that wrote it, so Step treats
// it as no state when the zone's algorithm has changed since, as the script
// does. ok is false for a value in none of these forms, which the script
// also counts as no state.
func DecodeLua(raw string) (st State, ok bool) {
	if raw == "" {
		return State{}, false
	}
	switch raw[0] {
	case 'g':
		var f [3]int64
		if !decodeFields(raw[1:], f[:], "-++") {
			return State{}, false
		}
		return State{Alg: GCRA, At: f[0], Debt: f[1], Scale: f[2]}, true
	case 'f':
		var f [3]int64
		if !decodeFields(raw[1:], f[:], "+-+") {
			return State{}, false
		}
		return State{Alg: FixedWindow, Debt: f[0], At: f[1], Scale: f[2]}, true
	case 's':
		var f [4]int64
		if !decodeFields(raw[1:], f[:], "++-+") {
			return State{}, false
		}
		return State{Alg: SlidingWindow, Prev: f[0], Debt: f[1], At: f[2], Scale: f[3]}, true
	case 'l':
		return decodeLog(raw[1:])
	}
	var f [3]int64
	if !decodeFields(raw, f[:], "--+") {
		return State{}, false
	}
	return State{Alg: TokenBucket, Debt: f[0], At: f[1], Scale: f[2]}, true
}

// decodeFields parses len(out) ':'-separated integers; signs[i] is '-' when
// field i may be negative (the Lua pattern's %-?%d+), '+' when not (%d+).
func decodeFields(s string, out []int64, signs string) bool {
	for i := range out {
		field := s
		if i < len(out)-1 {
			end := strings.IndexByte(s, ':')
			if end < 0 {
				return false
			}
			field, s = s[:end], s[end+1:]
		}
		n, ok := parseInt(field, signs[i] == '-')
		if !ok {
			return false
		}
		out[i] = n
	}
	return true
}

// decodeLog parses a sliding log's "<base>" then ",<d>" or ",<d>*<cost>"
// per event (the part after its 'l').
func decodeLog(s string) (State, bool) {
	end := strings.IndexByte(s, ',')
	if end < 0 {
		end = len(s)
	}
	base, ok := parseInt(s[:end], true)
	if !ok {
		return State{}, false
	}
	s = s[end:]
	lg := &Log{Entries: make([]LogEntry, 0, strings.Count(s, ","))}
	for s != "" {
		s = s[1:] // the ','
		item := s
		if next := strings.IndexByte(s, ','); next >= 0 {
			item, s = s[:next], s[next:]
		} else {
			s = ""
		}
		off, cost := item, "1"
		if star := strings.IndexByte(item, '*'); star >= 0 {
			off, cost = item[:star], item[star+1:]
		}
		d, ok1 := parseInt(off, false)
		c, ok2 := parseInt(cost, false)
		if !ok1 || !ok2 || c < 1 {
			return State{}, false
		}
		lg.Entries = append(lg.Entries, LogEntry{At: base + d, Cost: c})
	}
	return State{Alg: SlidingLog, Log: lg}, true
}

// parseInt parses an optional '-' (when neg) and at least one decimal digit,
// nothing else (strconv alone would accept a '+').
func parseInt(s string, neg bool) (int64, bool) {
	digits := s
	if neg && strings.HasPrefix(s, "-") {
		digits = s[1:]
	}
	if digits == "" {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}
