package redisstore

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Permissions: a Redis user restricted by ACL may lack what the decision
// needs. Missing Functions (FUNCTION, FCALL) is cured by the EVALSHA path
// (function.go); anything else (EVALSHA and EVAL, a command the code runs,
// the key pattern) is not: the store names what is missing at load (probe)
// and on every failed decision (permError), never as an outage. The rules
// per path: docs/redis.md, "Redis settings Sluice needs".

// scriptCommands are the commands the decision code runs inside Redis.
const scriptCommands = "+time +get +set +del +pttl +pexpire +decrby +incrby +zadd +zrem +zcard +zremrangebyscore"

// permError is a decision or a load that Redis refused this user: Need
// says what to grant.
type permError struct {
	err  error
	need string
}

func (e *permError) Error() string {
	return "redis refuses this user a permission Sluice needs (grant " + e.need + "; docs/redis.md, \"Redis settings Sluice needs\"): " + e.err.Error()
}
func (e *permError) Unwrap() error { return e.err }

// asPermError returns err as a *permError when Redis refused it for want
// of a permission (a NOPERM reply, or the error a script gets when one of
// its commands or keys is denied), else nil.
func (s *Store) asPermError(err error) *permError {
	if err == nil {
		return nil
	}
	if pe := (*permError)(nil); errors.As(err, &pe) {
		return pe
	}
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "NOPERM") && strings.Contains(msg, "keys"),
		strings.Contains(msg, "can't access at least one of the keys"):
		return &permError{err: err, need: "the key pattern ~" + s.prefix + "*"}
	case strings.HasPrefix(msg, "NOPERM"):
		need := "the command it names"
		if _, rest, ok := strings.Cut(msg, "run the '"); ok {
			if cmd, _, ok := strings.Cut(rest, "'"); ok {
				need = "+" + cmd
			}
		}
		return &permError{err: err, need: need}
	case strings.Contains(msg, "can't run this command or subcommand"):
		return &permError{err: err, need: "the commands the decision runs: " + scriptCommands}
	}
	return nil
}

// isNoPermFunctions: Redis refused this user FUNCTION or FCALL (ACL), which
// the EVALSHA path does without.
func isNoPermFunctions(err error) bool {
	if err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "'fcall") || strings.Contains(msg, "'function")
}

// probeKey is the key the load's probe decides on: a control key, in the
// prefix (an ACL key pattern covering the prefix covers it).
func (s *Store) probeKey() string { return s.ctlKey(ctlTag, "probe") }

// probe runs one decision the way requests do (FCALL, or EVALSHA then EVAL)
// on probeKey, a token bucket of a second that no request shares, so that
// a permission the decision lacks is named at load rather than on the
// first request. It returns a *permError, another failure, or nil.
func (s *Store) probe(ctx context.Context) error {
	req := algorithms.Request{Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Events: 1 << 30, Window: 1000}, Cost: 1}
	arg := string(s.argc.appendTake(nil, &req, false))
	keys := []string{s.probeKey()}
	var err error
	if s.scripts.evalsha.Load() {
		err = s.client.EvalSha(ctx, scriptSHA, keys, arg).Err()
		if isNoScript(err) {
			err = s.client.Eval(ctx, LuaScript, keys, arg).Err()
		}
	} else {
		err = s.client.FCall(ctx, LuaFunction, keys, arg).Err()
		if isNoPermFunctions(err) {
			s.scripts.evalsha.Store(true)
			return s.probe(ctx)
		}
	}
	if errors.Is(err, redis.Nil) {
		err = nil
	}
	if err == nil {
		s.client.Del(ctx, keys[0]) // leaves no key behind (it would expire within 2 s)
	}
	if pe := s.asPermError(err); pe != nil {
		return pe
	}
	return err
}
