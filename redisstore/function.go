package redisstore

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// The decision runs as a Redis Function (FCALL of LuaFunction,
// Redis 7+): its helpers and algorithms are defined once when the library
// loads, where an EVAL script's body defines them again on every call
// (docs/performance.md measures the difference). The library is loaded at
// Provision and again whenever Redis answers that the function is missing
// (a restart without persistence, FUNCTION FLUSH, a new node); replicas get
// it by replication, so a Sentinel failover keeps it. A server without
// Functions (Redis 6, FCALL renamed away, or FUNCTION or FCALL denied to
// this user by ACL) is detected on the first call and the store falls back
// to EVALSHA of the same code (LuaScript) for good, with EVAL on NOSCRIPT.

// scriptSHA is the SHA of LuaScript, for EVALSHA.
var scriptSHA = redis.NewScript(LuaScript).Hash()

// scripts decides how a store's calls run: FCALL, or EVALSHA on servers
// without Functions.
type scripts struct {
	client  redis.UniversalClient
	evalsha atomic.Bool // true: no Functions on this server
}

// command returns the command and its first argument that run the
// decision: FCALL and the function, or EVALSHA and the script's SHA;
// already in interfaces, so that a call boxes nothing.
func (m *scripts) command() (name, fn any) {
	if m.evalsha.Load() {
		return evalshaArgs[0], evalshaArgs[1]
	}
	return fcallArgs[0], fcallArgs[1]
}

var (
	fcallArgs   = [2]any{"fcall", LuaFunction}
	evalshaArgs = [2]any{"evalsha", scriptSHA}
)

// libLoad remembers, within one batch, whether the library was loaded
// and how that went.
type libLoad struct {
	done bool
	err  error
}

// retriable reports whether a call that failed with err is sent again
// (retry): Redis lacked the code, or (a Cluster) the node no longer owns
// the slot. Either way Redis decided nothing.
func (m *scripts) retriable(err error) bool {
	return noFunctions(err) || isNoScript(err) || isNoFunction(err) || isRedirect(err)
}

// retry queues on p again a call that failed with err only because Redis
// lacked the code (function missing, NOSCRIPT, or no Functions at all),
// loading the library first when needed (once per batch): as FCALL, or as
// EVAL (which also loads the script) once the server is known to lack
// Functions; or because a Cluster node answered MOVED or ASK: as a typed
// command, whose redirect go-redis follows (and whose slot map it then
// refreshes). When the load itself fails (a replica answering READONLY,
// an unreachable node), the call fails with that error, which says more
// than "function not found".
func (m *scripts) retry(ctx context.Context, p redis.Pipeliner, c *call, err error, load *libLoad) {
	switch {
	case noFunctions(err):
		m.evalsha.Store(true)
	case isNoFunction(err):
		if !load.done {
			load.done = true
			load.err = m.load(ctx)
			if noFunctions(load.err) {
				m.evalsha.Store(true)
				load.err = nil
			}
		}
		if load.err != nil {
			failed := redis.NewCmd(ctx)
			failed.SetErr(&loadError{load.err})
			c.cmd = failed
			return
		}
	}
	if m.evalsha.Load() {
		c.cmd = p.Eval(ctx, LuaScript, c.keyStrings(), c.args()...)
	} else {
		c.cmd = p.FCall(ctx, LuaFunction, c.keyStrings(), c.args()...)
	}
}

// readOnly queues on p again, as FCALL_RO of LuaFunctionRO, a call Redis
// refused for memory (OOM: under noeviction, FCALL of a function that may
// write is refused before it runs), so that a refusal, which writes
// nothing, is still decided. A call sent again that fails (it would have
// written) fails with the error it had (readOnlyFailed).
func (m *scripts) readOnly(ctx context.Context, p redis.Pipeliner, c *call) {
	c.cmd = p.FCallRO(ctx, LuaFunctionRO, c.keyStrings(), c.args()...)
}

// readOnlyFor reports whether a call that failed with err is sent again
// by readOnly: OOM, on the FCALL path (the EVALSHA path's script Redis
// runs under OOM until its first write).
func (m *scripts) readOnlyFor(err error) bool {
	return isOOM(err) && !m.evalsha.Load()
}

// readOnlyFailed gives c, sent again by readOnly, the error oom it had
// when the read-only decision failed too.
func readOnlyFailed(ctx context.Context, c *call, oom error) {
	if c.cmd.Err() != nil {
		failed := redis.NewCmd(ctx)
		failed.SetErr(oom)
		c.cmd = failed
	}
}

func isOOM(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "OOM")
}

// loadError is the error of a call that Redis answered "function not
// found" and that was not sent again because loading the library failed:
// its text is the load's (READONLY names the fault better than "function
// not found"), and it tells the store that Redis decided nothing.
type loadError struct{ err error }

func (e *loadError) Error() string { return e.err.Error() }
func (e *loadError) Unwrap() error { return e.err }

// load loads the library (on every master of a Cluster). A library already
// loaded is not an error.
func (m *scripts) load(ctx context.Context) error {
	one := func(ctx context.Context, c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, LuaLibrary).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			err = nil
		}
		return err
	}
	if cc, ok := m.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return one(ctx, c) })
	}
	return one(ctx, m.client)
}

// prepare readies the server at Provision: loads the library, or, on a
// server without Functions, the script (SCRIPT LOAD, on every master; a
// user denied SCRIPT LOAD gets it loaded by EVAL on the first NOSCRIPT).
func (m *scripts) prepare(ctx context.Context) error {
	err := m.load(ctx)
	if err == nil || !noFunctions(err) {
		return err
	}
	m.evalsha.Store(true)
	if err := m.client.ScriptLoad(ctx, LuaScript).Err(); err != nil && !isNoPerm(err) {
		return err
	}
	return nil
}

// noFunctions: the server has no Functions for this user (unknown
// command, or denied by ACL): the EVALSHA path does without them.
func noFunctions(err error) bool {
	return isUnknownCommand(err) || isNoPermFunctions(err)
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// isRedirect: a Cluster node's MOVED or ASK.
func isRedirect(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ")
}

func isNoFunction(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "ERR Function not found")
}

// isUnknownCommand: FCALL or FUNCTION unknown (Redis before 7, or renamed).
func isUnknownCommand(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "ERR unknown command") && (strings.Contains(msg, "fcall") || strings.Contains(msg, "FCALL") ||
		strings.Contains(msg, "function") || strings.Contains(msg, "FUNCTION"))
}
