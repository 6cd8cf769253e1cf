// Package redistest starts real Redis processes for tests: a standalone
// redis-server, a Redis Cluster of N masters, and a master/replica/sentinel
// set. There is no mock Redis anywhere in Sluice; tests talk to these.
//
// Every process listens on a free port of 127.0.0.1 only, keeps nothing on disk
// (save "", appendonly no) and has its own directory under t.TempDir() holding
// its config file and its log (stdout and stderr of the process). Every start
// is bounded (about 10 s) and every failure is reported with t.Fatalf and the
// tail of the log of the process concerned. Every process is stopped by
// t.Cleanup (SIGTERM, then SIGKILL after a short grace); on Linux a process
// is also killed if the test binary dies (PR_SET_PDEATHSIG), so a test
// timeout leaves no servers behind.
//
// The binaries come from PATH: redis-server, redis-sentinel (or, failing it,
// redis-server --sentinel). Redis 7.0 or newer is needed for clusters
// (cluster-port, CLUSTER ADDSLOTSRANGE). When redis-server is missing the
// test fails, it is never skipped: run scripts/ensure-redis.sh (make test
// does), which installs the Debian packages when run as root.
//
// This is a normal (non-test) package so that tests of several packages can
// import it; nothing but tests may import it.
//
// # API
//
// Standalone:
//
//	func Start(t testing.TB, extraConfig ...string) *Server
//	func (s *Server) Client() *redis.Client       // closed by t.Cleanup
//	func (s *Server) URL() string                 // redis://127.0.0.1:port
//	func (s *Server) Do(t testing.TB, args ...any) any
//	func (s *Server) DoErr(args ...any) (any, error)
//	func (s *Server) Info(t testing.TB, section string) map[string]string
//	func (s *Server) Stop()                       // SIGTERM, keeps port and dir
//	func (s *Server) Kill()                       // SIGKILL (a crash), keeps port and dir
//	func (s *Server) Restart(t testing.TB)        // same port, same dir, same config
//	func (s *Server) Running() bool
//	func (s *Server) Freeze(t testing.TB)         // SIGSTOP: accepts, never answers
//	func (s *Server) Thaw(t testing.TB)           // SIGCONT
//	func (s *Server) LogTail() string
//
// extraConfig entries are redis.conf lines, e.g. "maxmemory 10mb".
// Do and DoErr run one command through a fresh short-lived RESP2 connection
// (no CLIENT SETINFO, so it does not disturb command statistics); Do turns a
// nil reply into nil and any error into t.Fatalf.
//
// Fault injection:
//
//	func (s *Server) CommandCount(t testing.TB, name string) int64 // INFO commandstats calls, e.g. "evalsha"
//	func (s *Server) CommandStats(t testing.TB, name string) CommandStats // calls, rejected, failed
//	func (s *Server) ConnectedClients(t testing.TB) int           // INFO clients, counts the asking connection too
//	func (s *Server) MakeReadOnlyReplicaOf(t testing.TB, other *Server) // writes fail with READONLY (returns once synced)
//	func (s *Server) MakeMaster(t testing.TB)                      // REPLICAOF NO ONE
//	func (s *Server) SetOOM(t testing.TB)                          // maxmemory 1 + noeviction: writes fail with OOM
//	func (s *Server) ClearOOM(t testing.TB)
//
// Cluster (masters only, no replicas; slots split evenly, all 16384 covered;
// each node's cluster bus port is picked free too, hence Redis 7):
//
//	func StartCluster(t testing.TB, masters int) *Cluster
//	func (c *Cluster) Addrs() []string               // seed nodes
//	func (c *Cluster) Client() *redis.ClusterClient  // closed by t.Cleanup
//	func (c *Cluster) NodeForKey(t testing.TB, key string) *Server
//	func (c *Cluster) WaitHealthy(t testing.TB)      // e.g. after restarting a node
//	c.Nodes []*Server
//
// Sentinel (one master, one replica, one sentinel, master name "mymaster"):
//
//	func StartSentinel(t testing.TB) *SentinelSet
//	func StartSentinels(t testing.TB, n int) *SentinelSet // n sentinels, majority quorum; Failover asks the first
//	func (s *SentinelSet) URL() string // redis://127.0.0.1:<sentinel port>?master_name=mymaster, for redis.ParseFailoverURL
//	func (s *SentinelSet) FailoverClient() *redis.Client // closed by t.Cleanup
//	func (s *SentinelSet) Failover(t testing.TB) // SENTINEL FAILOVER; afterwards Master and Replica are swapped
//	s.MasterName, s.SentinelAddr, s.Master, s.Replica, s.Sentinel, s.Sentinels
//
// StartSentinel and Failover make sure the replica has acknowledged every
// write the master accepted (SET+DEL of "redistest:replication-barrier",
// then WAIT 1), so no acknowledged write is lost by a Failover; those two
// commands show in the master's command statistics.
//
// Ports:
//
//	func FreePort(t testing.TB) int // a free 127.0.0.1 port, never the same twice in one test binary
package redistest
