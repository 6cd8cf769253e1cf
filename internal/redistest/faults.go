package redistest

import (
	"strconv"
	"strings"
	"testing"
)

// CommandStats is one line of INFO commandstats.
type CommandStats struct {
	// Calls counts executions, including those that failed while running
	// (an EVALSHA answered NOSCRIPT counts here and in Failed).
	Calls int64
	// Rejected counts calls refused before running (OOM, READONLY, wrong
	// arity, ...); they are not in Calls. A write refused inside a script
	// counts as a rejected call of that write command (e.g. set), while the
	// EVAL counts in Calls and Failed.
	Rejected int64
	// Failed counts calls that ran and returned an error.
	Failed int64
}

// CommandStats returns the statistics of one command since the server
// started (or since CONFIG RESETSTAT), from INFO commandstats:
// cmdstat_<name>:calls=N,...,rejected_calls=N,failed_calls=N. name is
// case-insensitive; subcommands are written as Redis 7 does, e.g.
// "script|load". A command never called has all zeros.
func (s *Server) CommandStats(t testing.TB, name string) CommandStats {
	t.Helper()
	info := s.Info(t, "commandstats")
	v, ok := info["cmdstat_"+strings.ToLower(name)]
	if !ok {
		return CommandStats{}
	}
	var st CommandStats
	for _, field := range strings.Split(v, ",") {
		k, n, _ := strings.Cut(field, "=")
		var dst *int64
		switch k {
		case "calls":
			dst = &st.Calls
		case "rejected_calls":
			dst = &st.Rejected
		case "failed_calls":
			dst = &st.Failed
		default:
			continue
		}
		x, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			t.Fatalf("redistest: %s commandstats %s: %q: %v", s.Addr, name, v, err)
		}
		*dst = x
	}
	return st
}

// CommandCount returns CommandStats(t, name).Calls, e.g. CommandCount(t,
// "evalsha") for cmdstat_evalsha:calls=N.
func (s *Server) CommandCount(t testing.TB, name string) int64 {
	t.Helper()
	return s.CommandStats(t, name).Calls
}

// ConnectedClients returns connected_clients from INFO clients. The count
// includes the short-lived connection that asks (so it is at least 1).
func (s *Server) ConnectedClients(t testing.TB) int {
	t.Helper()
	v := s.Info(t, "clients")["connected_clients"]
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("redistest: %s connected_clients %q: %v", s.Addr, v, err)
	}
	return n
}

// MakeReadOnlyReplicaOf turns s into a replica of other (REPLICAOF), so
// writes to s fail with READONLY (replica-read-only is on by default). The
// replica drops its own data and loads other's. It returns once s reports
// role:slave with its link to other up: the sync (during which the replica
// loads other's data and may block for a moment) is over, so what a test
// sees next is the READONLY replica, not the sync. Undo with MakeMaster.
func (s *Server) MakeReadOnlyReplicaOf(t testing.TB, other *Server) {
	t.Helper()
	s.Do(t, "REPLICAOF", "127.0.0.1", strconv.Itoa(other.Port))
	waitUntil(t, startTimeout, s.Addr+" becomes a synced replica", func() (bool, string) {
		info := s.Info(t, "replication")
		return info["role"] == "slave" && info["master_link_status"] == "up",
			"role:" + info["role"] + " master_link_status:" + info["master_link_status"]
	}, s)
}

// MakeMaster makes s a master again (REPLICAOF NO ONE). Its data are kept.
func (s *Server) MakeMaster(t testing.TB) {
	t.Helper()
	s.Do(t, "REPLICAOF", "NO", "ONE")
}

// SetOOM makes every write to s fail with an OOM error: maxmemory 1 byte
// with the noeviction policy. Reads, and commands that allocate nothing,
// still work. Undo with ClearOOM.
func (s *Server) SetOOM(t testing.TB) {
	t.Helper()
	s.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	s.Do(t, "CONFIG", "SET", "maxmemory", "1")
}

// ClearOOM removes the memory limit set by SetOOM (maxmemory 0).
func (s *Server) ClearOOM(t testing.TB) {
	t.Helper()
	s.Do(t, "CONFIG", "SET", "maxmemory", "0")
}

// roleOf returns the first element of ROLE ("master", "slave", "sentinel"),
// or the error text.
func roleOf(addr string) string {
	v, err := doAt(addr, "ROLE")
	if err != nil {
		return "error: " + err.Error()
	}
	if a, ok := v.([]any); ok && len(a) > 0 {
		if r, ok := a[0].(string); ok {
			return r
		}
	}
	return "unexpected ROLE reply"
}

// FillMemory fills s to its memory limit: the noeviction policy, maxmemory
// 1 MB above the memory in use, then values written until Redis refuses a
// write for memory (OOM), then maxmemory 64 KB below the memory in use (as
// full stays full). Reads, and commands that allocate nothing, still
// work. Undo with ClearOOM (the filler keys stay).
func (s *Server) FillMemory(t testing.TB) {
	t.Helper()
	used, err := strconv.ParseInt(s.Info(t, "memory")["used_memory"], 10, 64)
	if err != nil {
		t.Fatalf("redistest: %s used_memory: %v", s.Addr, err)
	}
	s.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	s.Do(t, "CONFIG", "SET", "maxmemory", strconv.FormatInt(used+1<<20, 10))
	value := strings.Repeat("x", 16<<10)
	for i := range 1000 {
		_, err := s.DoErr("SET", "redistest:fill:"+strconv.Itoa(i), value)
		if err != nil && strings.HasPrefix(err.Error(), "OOM") {
			// Full; the filling connection's buffers, freed as it
			// closes, would make room for a few small writes: a limit
			// below what remains keeps every write refused.
			used, _ := strconv.ParseInt(s.Info(t, "memory")["used_memory"], 10, 64)
			s.Do(t, "CONFIG", "SET", "maxmemory", strconv.FormatInt(used-64<<10, 10))
			return
		}
		if err != nil {
			t.Fatalf("redistest: %s filling memory: %v", s.Addr, err)
		}
	}
	t.Fatalf("redistest: %s: 16 MB written and no OOM", s.Addr)
}
