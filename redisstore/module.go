// Package redisstore is Sluice's shared store: rate limit state in Redis
// (standalone, Sentinel or Cluster), decided atomically where the data is by
// one Lua script per request, with the time read from Redis, under a tight
// timeout. Every Caddy instance pointed at the same Redis enforces one limit
// together.
//
// It implements the store contract of package stores (Store and the
// capabilities it asserts at the end of this file); it never imports the
// handler's package.
package redisstore

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/stores"
)

func init() {
	caddy.RegisterModule(Redis{})
	// go-redis prints every failed dial through a process-wide logger: an
	// outage would print a line per request. Sluice reports store errors
	// itself, rate-limited, through Caddy's logger.
	redis.SetLogger(quietLogger{})
}

// quietLogger drops go-redis's internal log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// pool keeps clients alive across config reloads and shares one client
// between every directive configured with the same connection settings.
var pool = caddy.NewUsagePool()

// Defaults.
const (
	DefaultTimeout   = 100 * time.Millisecond
	DefaultKeyPrefix = "sluice:v1:"
	// DefaultLateReplyGrace: see Redis.LateReplyGrace.
	DefaultLateReplyGrace = 100 * time.Millisecond
	// MaxLateReplyGrace bounds the option.
	MaxLateReplyGrace = time.Second
	// MinTimeout and MaxTimeout bound the decision timeout: below 1ms not
	// even a loopback round trip fits, above 1m a request waits longer
	// than any client would.
	MinTimeout = time.Millisecond
	MaxTimeout = time.Minute
	// MaxKeyPrefix bounds key_prefix's length in bytes.
	MaxKeyPrefix = 128
	// MinDenyCacheSize and MaxDenyCacheSize bound a deny cache that is on
	// (about 25 GB at the maximum).
	MinDenyCacheSize = 100
	MaxDenyCacheSize = 100_000_000
)

// Redis is the shared store. Configure exactly one of URL (a standalone
// server, or Sentinel with the redis+sentinel scheme) or Cluster.
// docs/reference.md lists the fields; docs/redis.md says what they do under
// load and failure.
type Redis struct {
	// URL of the Redis server: redis://[user:password@]host:port[/db],
	// rediss:// for TLS, or for Sentinel
	// redis+sentinel://[user:password@]host:port[/db]?master_name=<name>[&addr=<host:port>...]
	// (rediss+sentinel for TLS; the URL's user and password are the
	// Sentinels', the master's go in password= and username=).
	// Placeholders such as {env.REDIS_URL} are resolved at Provision; the
	// URL is never logged.
	URL string `json:"url,omitempty"`

	// Cluster lists seed nodes (host:port) of a Redis Cluster.
	Cluster []string `json:"cluster,omitempty"`

	// Username and Password authenticate to Cluster nodes (a URL carries
	// its own). Placeholders are resolved at Provision.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`

	// TLS connects to Cluster nodes over TLS (a URL says so with rediss).
	TLS bool `json:"tls,omitempty"`

	// TLSCA is a PEM file of the CA certificates that verify the server's
	// certificate (a private CA), instead of the system's roots. Needs TLS
	// (rediss://, rediss+sentinel:// or tls). Placeholders are resolved at
	// Provision. Default: the system's roots.
	TLSCA string `json:"tls_ca,omitempty"`

	// TLSCert and TLSKey are the PEM files of the client certificate and
	// its key that the store presents (mutual TLS); set both or neither.
	// Need TLS. Placeholders are resolved at Provision. Default: none.
	TLSCert string `json:"tls_cert,omitempty"`
	TLSKey  string `json:"tls_key,omitempty"`

	// Timeout bounds each decision end to end (pool wait, connect, the
	// call, one reload retry); then the zones' fail policy decides.
	// 1ms to 1m. Default: 100ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// LateReplyGrace is how much longer a decision already sent when the
	// timeout passes waits for its reply, which then decides; past it the
	// fail policy applies. 0 is off, else 1ms to 1s. Default: 100ms.
	LateReplyGrace *caddy.Duration `json:"late_reply_grace,omitempty"`

	// KeyPrefix starts every key Sluice writes: at most 128 printable
	// ASCII characters, no space, '{' or '}' (the Cluster hash tag) and no
	// '*', '?', '[', ']' or '\' (so the pattern <prefix>* of an ACL or a
	// --scan matches exactly its keys). Default: "sluice:v1:".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// PoolSize is the number of connections per node. Default: go-redis's
	// (10 per CPU).
	PoolSize int `json:"pool_size,omitempty"`

	// Pipelines is the number of pipeline workers carrying decisions
	// (concurrent decisions share round trips): 1 to 64, at most PoolSize.
	// Default: 2.
	Pipelines int `json:"pipelines,omitempty"`

	// Breaker configures the circuit breaker in front of each node (the
	// server, or each Cluster master): after consecutive failures of a
	// node it fails every decision on that node at once (an error wrapping
	// ErrCircuitOpen, the zones' fail policy) until a probe succeeds.
	// Default: on, 5 failures, a 1s cool-down doubling up to 5s.
	Breaker *Breaker `json:"breaker,omitempty"`

	// DenyCacheSize bounds this instance's deny cache, which answers a
	// refused client's next requests locally while Redis would still
	// refuse them, exactly. 0 turns it off, else 100 to 100000000.
	// Default: 10000 entries (about 2.5 MB).
	DenyCacheSize *int `json:"deny_cache_size,omitempty"`

	// Store is the shared store of this configuration, set at Provision:
	// its methods (Take, LocalAllowance, Pin, Unpin) are the module's.
	*Store  `json:"-"`
	poolKey string
	logger  *zap.Logger
}

// Breaker configures the store's circuit breaker (see Redis.Breaker).
type Breaker struct {
	// Off disables the breaker: every decision calls Redis and pays up to
	// the timeout while it fails.
	Off bool `json:"off,omitempty"`
	// Failures is the number of consecutive failures that opens the
	// circuit. Default: 5.
	Failures int `json:"failures,omitempty"`
	// Cooldown is how long the circuit stays open before a probe; it
	// doubles after each failed probe. Default: 1s.
	Cooldown caddy.Duration `json:"cooldown,omitempty"`
	// MaxCooldown caps the cool-down. Default: 5s.
	MaxCooldown caddy.Duration `json:"max_cooldown,omitempty"`
}

// options resolves the breaker and deny cache settings with defaults.
func (r *Redis) options() storeOptions {
	o := defaultOptions()
	if b := r.Breaker; b != nil {
		if b.Off {
			o.Failures = 0
		}
		if b.Failures > 0 && !b.Off {
			o.Failures = b.Failures
		}
		if b.Cooldown > 0 {
			o.Cooldown = time.Duration(b.Cooldown)
		}
		if b.MaxCooldown > 0 {
			o.MaxCooldown = time.Duration(b.MaxCooldown)
		}
		o.MaxCooldown = max(o.MaxCooldown, o.Cooldown)
	}
	if r.DenyCacheSize != nil {
		o.DenySize = *r.DenyCacheSize
	}
	if r.LateReplyGrace != nil {
		o.Grace = time.Duration(*r.LateReplyGrace)
	}
	return o
}

// CaddyModule returns the Caddy module information.
func (Redis) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit.stores.redis",
		New: func() caddy.Module { return new(Redis) },
	}
}

// Provision resolves placeholders, applies defaults and attaches the shared
// client of this configuration. An unreachable Redis is a warning, not an
// error: decisions go through the zones' fail policy until it answers.
func (r *Redis) Provision(ctx caddy.Context) error {
	r.logger = ctx.Logger()
	if r.Timeout == 0 {
		r.Timeout = caddy.Duration(DefaultTimeout)
	}
	if r.KeyPrefix == "" {
		r.KeyPrefix = DefaultKeyPrefix
	}
	if err := r.validate(); err != nil {
		return err
	}
	repl := caddy.NewReplacer()
	rawURL := repl.ReplaceAll(r.URL, "")
	username := repl.ReplaceAll(r.Username, "")
	password := repl.ReplaceAll(r.Password, "")
	tlsCA, tlsCert, tlsKey := repl.ReplaceAll(r.TLSCA, ""), repl.ReplaceAll(r.TLSCert, ""), repl.ReplaceAll(r.TLSKey, "")
	for _, f := range []struct{ name, raw, val string }{
		{"url", r.URL, rawURL}, {"username", r.Username, username}, {"password", r.Password, password},
		{"tls_ca", r.TLSCA, tlsCA}, {"tls_cert", r.TLSCert, tlsCert}, {"tls_key", r.TLSKey, tlsKey},
	} {
		if err := checkResolved(f.name, f.raw, f.val); err != nil {
			return err
		}
	}

	if err := registerStoreMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("store redis: registering metrics: %w", err)
	}
	opts := r.options()
	cfg := connConfig{URL: rawURL, Cluster: r.Cluster, Username: username, Password: password, TLS: r.TLS,
		Timeout: time.Duration(r.Timeout), Prefix: r.KeyPrefix, PoolSize: r.PoolSize, Pipelines: r.Pipelines,
		Failures: opts.Failures, Cooldown: opts.Cooldown, MaxCooldown: opts.MaxCooldown, DenySize: opts.DenySize, Grace: opts.Grace}
	if tlsCA != "" || tlsCert != "" {
		if !cfg.usesTLS() {
			return errors.New("store redis: tls_ca, tls_cert and tls_key need TLS: a rediss:// or rediss+sentinel:// url, or tls with cluster")
		}
		if err := cfg.tlsFiles(tlsCA, tlsCert, tlsKey); err != nil {
			return err
		}
	}
	opts.Target, opts.Node, opts.Logger, opts.Workers, opts.SyncLanes = cfg.describe(), cfg.node(), r.logger, cfg.workers(), cfg.syncLanes()
	client, cluster, err := cfg.newClient()
	if err != nil {
		return err
	}
	closeClient(client) // only a check; the pooled client is made below once per configuration
	r.poolKey = cfg.key()
	v, loaded, err := pool.LoadOrNew(r.poolKey, func() (caddy.Destructor, error) {
		c, _, err := cfg.newClient()
		if err != nil {
			return nil, err
		}
		return newStoreWith(c, cluster, r.KeyPrefix, time.Duration(r.Timeout), opts), nil
	})
	if err != nil {
		return err
	}
	r.Store = v.(*Store)
	if !loaded {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		err := r.Store.warm(pctx)
		if pe := (*permError)(nil); errors.As(err, &pe) {
			r.logger.Error("redis refuses this user a permission Sluice needs; decisions follow each zone's fail policy until it is granted",
				zap.String("target", cfg.describe()), zap.String("grant", pe.need), zap.Error(pe.err))
		} else if te := (*tlsError)(nil); errors.As(err, &te) {
			r.logger.Error("the TLS handshake with redis failed; decisions follow each zone's fail policy until it succeeds (check tls_ca, tls_cert and tls_key)",
				zap.String("target", cfg.describe()), zap.Error(te))
		} else if err != nil {
			r.logger.Warn("redis is not reachable yet; decisions follow each zone's fail policy until it is",
				zap.String("target", cfg.describe()), zap.Error(redactErr(err, rawURL, password)))
		}
		if err == nil {
			r.Store.checkEviction(pctx)
		}
	}
	return nil
}

// checkResolved fails when a field set with placeholders resolved to
// nothing: an unset environment variable, most likely. Named here, at
// load, rather than as a failed connection on every request.
func checkResolved(field, raw, val string) error {
	if !strings.Contains(raw, "{") || strings.TrimSpace(val) != "" {
		return nil
	}
	var unset []string
	for rest := raw; ; {
		i := strings.Index(rest, "{env.")
		if i < 0 {
			break
		}
		rest = rest[i+len("{env."):]
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			break
		}
		if name := rest[:end]; os.Getenv(name) == "" {
			unset = append(unset, name)
		}
		rest = rest[end+1:]
	}
	if len(unset) > 0 {
		return fmt.Errorf("store redis: %s %q is empty: the environment variable %s is not set or empty", field, raw, strings.Join(unset, ", "))
	}
	return fmt.Errorf("store redis: %s %q is empty once its placeholders are replaced", field, raw)
}

// validate checks what can be checked before placeholders are resolved.
func (r *Redis) validate() error {
	switch {
	case r.URL == "" && len(r.Cluster) == 0:
		return errors.New("store redis: url or cluster is required")
	case r.URL != "" && len(r.Cluster) > 0:
		return errors.New("store redis: set url or cluster, not both")
	case (r.TLSCert == "") != (r.TLSKey == ""):
		return errors.New("store redis: tls_cert and tls_key go together: set both or neither")
	}
	return r.checkValues()
}

// checkValues checks each field set (0 and nil are defaults) on its own:
// Validate's rules, which UnmarshalCaddyfile applies after each field so
// that an error names its line. A URL holding a placeholder is checked once
// resolved, at Provision.
func (r *Redis) checkValues() error {
	switch {
	case r.Timeout != 0 && (time.Duration(r.Timeout) < MinTimeout || time.Duration(r.Timeout) > MaxTimeout):
		return fmt.Errorf("store redis: timeout must be between %s and %s, got %s", MinTimeout, MaxTimeout, time.Duration(r.Timeout))
	case r.PoolSize < 0:
		return fmt.Errorf("store redis: pool_size must be positive, got %d", r.PoolSize)
	case r.Pipelines < 0 || r.Pipelines > maxWorkers:
		return fmt.Errorf("store redis: pipelines must be between 1 and %d, got %d", maxWorkers, r.Pipelines)
	case r.LateReplyGrace != nil && *r.LateReplyGrace != 0 &&
		(time.Duration(*r.LateReplyGrace) < time.Millisecond || time.Duration(*r.LateReplyGrace) > MaxLateReplyGrace):
		return fmt.Errorf("store redis: late_reply_grace must be 0 (off) or between 1ms and %s, got %s", MaxLateReplyGrace, time.Duration(*r.LateReplyGrace))
	case r.DenyCacheSize != nil && *r.DenyCacheSize != 0 && (*r.DenyCacheSize < MinDenyCacheSize || *r.DenyCacheSize > MaxDenyCacheSize):
		return fmt.Errorf("store redis: deny_cache_size must be 0 (off) or between %d and %d, got %d", MinDenyCacheSize, MaxDenyCacheSize, *r.DenyCacheSize)
	case r.Breaker != nil && (r.Breaker.Failures < 0 || r.Breaker.Cooldown < 0 || r.Breaker.MaxCooldown < 0):
		return errors.New("store redis: breaker: failures, cooldown and max_cooldown must be positive")
	case strings.ContainsAny(r.KeyPrefix, "{}"):
		return fmt.Errorf("store redis: key_prefix %q must not contain '{' or '}' (they would change the Cluster hash tag)", r.KeyPrefix)
	case len(r.KeyPrefix) > MaxKeyPrefix:
		return fmt.Errorf("store redis: key_prefix must be at most %d bytes, got %d", MaxKeyPrefix, len(r.KeyPrefix))
	case strings.IndexFunc(r.KeyPrefix, func(c rune) bool { return c <= ' ' || c > '~' || strings.ContainsRune(`*?[]\`, c) }) >= 0:
		return fmt.Errorf("store redis: key_prefix %q must be printable ASCII without spaces or the pattern characters * ? [ ] \\", r.KeyPrefix)
	}
	for _, a := range r.Cluster {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("store redis: cluster address %q: %v", a, err)
		}
	}
	if r.URL != "" && !strings.Contains(r.URL, "{") {
		if _, _, err := parseURL(r.URL, r.Password); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks the configuration.
func (r *Redis) Validate() error { return r.validate() }

// Cleanup releases this configuration's hold on the shared client. When it
// is the last hold and requests still hold slots of the store, or use it
// otherwise (Store.Pin: charges in flight, their refunds) (a reload
// that changed the store's settings lets the old configuration's requests
// finish), the store is kept, renewing and then releasing their leases,
// until they have ended.
func (r *Redis) Cleanup() error {
	if r.poolKey == "" {
		return nil
	}
	key := r.poolKey
	r.poolKey = ""
	if n, _ := pool.References(key); n == 1 && r.Store.inUse() {
		go func(s *Store) {
			for s.inUse() {
				time.Sleep(keeperTick)
			}
			_, _ = pool.Delete(key)
		}(r.Store)
		return nil
	}
	_, err := pool.Delete(key)
	return err
}

// Key identifies the store for the zone registry: the connection target and
// key prefix, never a secret.
func (r *Redis) Key() string {
	return "redis " + r.poolKey
}

// connConfig is a store's resolved connection configuration.
type connConfig struct {
	URL       string
	Cluster   []string
	Username  string
	Password  string
	TLS       bool
	Timeout   time.Duration
	Prefix    string
	PoolSize  int
	Pipelines int
	// The breaker and deny cache settings: stores that differ in them do
	// not share a client (nor a breaker).
	Failures    int
	Cooldown    time.Duration
	MaxCooldown time.Duration
	DenySize    int
	// Grace is the late-reply grace: the pipeline connections' read
	// deadline reaches past the timeout by it.
	Grace time.Duration
	// CA, Cert and Key are the contents of tls_ca, tls_cert and tls_key
	// (tls.go): a renewed file makes another client at the next reload.
	CA, Cert, Key []byte
}

// usesTLS reports whether the store connects over TLS.
func (c connConfig) usesTLS() bool {
	if len(c.Cluster) > 0 {
		return c.TLS
	}
	u, err := url.Parse(c.URL)
	return err == nil && (u.Scheme == "rediss" || u.Scheme == "rediss+sentinel")
}

// key is the pool key: a digest of the whole configuration, so that secrets
// never appear in it, and two directives with the same settings share one
// client.
func (c connConfig) key() string {
	b, _ := json.Marshal(c)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// describe names the target for logs, without credentials.
func (c connConfig) describe() string {
	if len(c.Cluster) > 0 {
		return "cluster " + strings.Join(c.Cluster, ",")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return "redis"
	}
	return u.Scheme + "://" + u.Host
}

// node labels a standalone or Sentinel store's one node in the breaker's
// metrics: the server's host:port (a socket's path), or the Sentinel
// master's name.
func (c connConfig) node() string {
	u, err := url.Parse(c.URL)
	switch {
	case err != nil:
		return "redis"
	case strings.HasSuffix(u.Scheme, "+sentinel"):
		return u.Query().Get("master_name")
	case u.Scheme == "unix":
		return u.Path
	}
	return u.Host
}

// newClient builds the go-redis client. Every wait is bounded by the
// decision timeout, and go-redis's own retries are off: a retry would only
// spend the same deadline.
func (c connConfig) newClient() (redis.UniversalClient, bool, error) {
	if len(c.Cluster) > 0 {
		opt := &redis.ClusterOptions{
			Addrs:    c.Cluster,
			Username: c.Username,
			Password: c.Password,
			PoolSize: c.PoolSize,
		}
		bound(c.Timeout, c.Grace, &opt.ContextTimeoutEnabled, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.PoolTimeout,
			&opt.MaxRetries, &opt.DialerRetries, &opt.DialerRetryTimeout)
		if c.TLS {
			opt.TLSConfig, opt.Dialer = c.tlsDialer(&tls.Config{MinVersion: tls.VersionTLS12}, opt.DialTimeout)
		}
		opt.MaxRedirects = 2
		opt.PipelinePoolSize, opt.PipelineReadBufferSize, opt.PipelineWriteBufferSize = c.pipelines()
		return redis.NewClusterClient(opt), true, nil
	}
	opt, fopt, err := parseURL(c.URL, c.Password)
	if err != nil {
		return nil, false, err
	}
	if fopt != nil {
		opt := fopt
		if c.PoolSize > 0 {
			opt.PoolSize = c.PoolSize
		}
		bound(c.Timeout, c.Grace, &opt.ContextTimeoutEnabled, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.PoolTimeout,
			&opt.MaxRetries, &opt.DialerRetries, &opt.DialerRetryTimeout)
		if opt.TLSConfig != nil {
			opt.TLSConfig, opt.Dialer = c.tlsDialer(opt.TLSConfig, opt.DialTimeout)
		}
		opt.PipelinePoolSize, opt.PipelineReadBufferSize, opt.PipelineWriteBufferSize = c.pipelines()
		return newGuardedFailoverClient(opt, c.Timeout), false, nil
	}
	if c.PoolSize > 0 {
		opt.PoolSize = c.PoolSize
	}
	bound(c.Timeout, c.Grace, &opt.ContextTimeoutEnabled, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.PoolTimeout,
		&opt.MaxRetries, &opt.DialerRetries, &opt.DialerRetryTimeout)
	if opt.TLSConfig != nil {
		opt.TLSConfig, opt.Dialer = c.tlsDialer(opt.TLSConfig, opt.DialTimeout)
	}
	opt.PipelinePoolSize, opt.PipelineReadBufferSize, opt.PipelineWriteBufferSize = c.pipelines()
	return redis.NewClient(opt), false, nil
}

// parseURL reads a resolved url: a server's options, or a Sentinel
// setup's. Its errors never hold the URL or the password.
func parseURL(rawURL, password string) (*redis.Options, *redis.FailoverOptions, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, nil, errors.New("store redis: url: malformed URL")
	}
	switch u.Scheme {
	case "redis+sentinel", "rediss+sentinel":
		u.Scheme = strings.TrimSuffix(u.Scheme, "+sentinel")
		opt, err := redis.ParseFailoverURL(u.String())
		if err != nil {
			return nil, nil, fmt.Errorf("store redis: url: %v", redactErr(err, rawURL, password))
		}
		if opt.MasterName == "" {
			return nil, nil, errors.New("store redis: url: a Sentinel URL needs ?master_name=<name>")
		}
		return nil, opt, nil
	case "redis", "rediss", "unix":
		opt, err := redis.ParseURL(rawURL)
		if err != nil {
			return nil, nil, fmt.Errorf("store redis: url: %v", redactErr(err, rawURL, password))
		}
		return opt, nil, nil
	}
	return nil, nil, fmt.Errorf("store redis: url: unsupported scheme %q (use redis://, rediss://, redis+sentinel:// or rediss+sentinel://)", u.Scheme)
}

// workers is the number of pipeline workers (batch.go) of a store with
// this configuration: pipelines (default defaultWorkers), at most
// pool_size.
func (c connConfig) workers() int {
	n := defaultWorkers
	if c.Pipelines > 0 {
		n = c.Pipelines
	}
	if c.PoolSize > 0 && c.PoolSize < n {
		n = c.PoolSize
	}
	return n
}

// pipelines sizes go-redis's pipeline pool (the connections the pipeline
// workers use, per node): one connection per worker and one per spare
// (batch.go; within pool_size when it is set), with buffers for a batch of
// maxPipeline calls (a call is about 150 bytes each way) rather than
// go-redis's 128 KiB default.
// syncLanes is how many pipelines a sync of the asynchronous mode runs at
// once: syncLanes, or with a pool_size set, what the pool holds beside the
// decisions' workers (at least one), so that a sync never makes decisions
// wait for a connection.
func (c connConfig) syncLanes() int {
	if c.PoolSize <= 0 {
		return syncLanes // the pipeline pool spills to go-redis's default pool (10 per CPU)
	}
	return max(1, min(syncLanes, c.PoolSize-c.workers()))
}

func (c connConfig) pipelines() (poolSize, readBuf, writeBuf int) {
	n := 2 * c.workers()
	if c.PoolSize > 0 {
		n = max(c.workers(), min(n, c.PoolSize))
	}
	return n, 32 << 10, 32 << 10
}

// bound makes every wait of a go-redis client honour the decision timeout:
// the context's deadline governs socket I/O, each dial, write and pool wait
// is capped at the timeout and each read at the timeout plus the late-reply
// grace (a sent decision's reply may still decide that late: batch.go),
// command retries are off (a retry only spends the same deadline, and
// would send a decision twice), and a refused dial is retried at most
// once, 1ms later, instead of go-redis's default of five times 100ms.
func bound(t, grace time.Duration, ctxTimeout *bool, dial, read, write, poolWait *time.Duration, retries, dialRetries *int, dialBackoff *time.Duration) {
	*ctxTimeout = true
	*dial, *read, *write, *poolWait = t, t+grace, t, t
	*retries = -1
	*dialRetries = 1
	*dialBackoff = time.Millisecond
}

// redactErr removes the URL and the password from an error's text.
func redactErr(err error, secrets ...string) error {
	msg := err.Error()
	for _, s := range secrets {
		if len(s) >= 4 {
			msg = strings.ReplaceAll(msg, s, "[redacted]")
		}
	}
	return errors.New(msg)
}

// UnmarshalCaddyfile sets up the store from Caddyfile tokens: `store redis
// [<url>] { ... }`, whose grammar is docs/reference.md's "Store redis" and
// "Breaker" (docs_test.go holds those sections to this parser).
func (r *Redis) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the store's name
	if d.NextArg() {
		r.URL = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
		if err := r.checkValues(); err != nil {
			return d.WrapErr(err)
		}
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		field := d.Val()
		if seen[field] {
			return d.Errf("store redis: duplicate %s", field)
		}
		seen[field] = true
		args := d.RemainingArgs()
		var err error
		switch field {
		case "cluster":
			if len(args) == 0 {
				return d.Err("store redis: cluster needs at least one host:port")
			}
			r.Cluster = args
		case "tls":
			if len(args) != 0 {
				return d.Err("store redis: tls takes no value")
			}
			r.TLS = true
		case "breaker":
			err = r.unmarshalBreaker(d, args)
		case "url", "username", "password", "timeout", "late_reply_grace", "key_prefix", "pipelines", "pool_size", "deny_cache", "deny_cache_size",
			"tls_ca", "tls_cert", "tls_key":
			if len(args) != 1 {
				return d.Errf("store redis: %s takes one value", field)
			}
			if err = r.setOption(field, args[0]); err != nil {
				err = d.WrapErr(err)
			}
		default:
			return d.Errf("store redis: unknown option %q (known: url, cluster, username, password, tls, tls_ca, tls_cert, tls_key, timeout, late_reply_grace, key_prefix, pool_size, pipelines, breaker, deny_cache, deny_cache_size)", field)
		}
		if err != nil {
			return err
		}
		if err := r.checkValues(); err != nil {
			return d.WrapErr(err) // at the field's line, as JSON is refused at load
		}
	}
	if err := r.validate(); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

// setOption sets the option field, which takes one value, to v.
func (r *Redis) setOption(field, v string) error {
	bad := func(want string) error { return fmt.Errorf("store redis: %s must be %s, got %q", field, want, v) }
	switch field {
	case "url":
		if r.URL != "" {
			return errors.New("store redis: url given twice")
		}
		r.URL = v
	case "username":
		r.Username = v
	case "password":
		r.Password = v
	case "key_prefix":
		r.KeyPrefix = v
	case "tls_ca":
		r.TLSCA = v
	case "tls_cert":
		r.TLSCert = v
	case "tls_key":
		r.TLSKey = v
	case "timeout":
		dur, err := caddy.ParseDuration(v)
		if err != nil || dur <= 0 {
			return bad("a positive duration")
		}
		r.Timeout = caddy.Duration(dur)
	case "late_reply_grace":
		dur := time.Duration(0)
		if v != "off" {
			var err error
			if dur, err = caddy.ParseDuration(v); err != nil {
				return bad("off or a duration")
			}
		}
		g := caddy.Duration(dur)
		r.LateReplyGrace = &g
	case "pipelines":
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > maxWorkers {
			return bad("an integer between 1 and " + strconv.Itoa(maxWorkers))
		}
		r.Pipelines = n
	case "pool_size":
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return bad("a positive integer")
		}
		r.PoolSize = n
	case "deny_cache":
		switch v {
		case "off":
			r.DenyCacheSize = new(int)
		case "on":
		default:
			return fmt.Errorf("store redis: deny_cache is on or off, got %q", v)
		}
	case "deny_cache_size":
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return bad("a non-negative integer")
		}
		r.DenyCacheSize = &n
	}
	return nil
}

// unmarshalBreaker parses `breaker off` or a breaker block.
func (r *Redis) unmarshalBreaker(d *caddyfile.Dispenser, args []string) error {
	b := &Breaker{}
	r.Breaker = b
	switch {
	case len(args) == 1 && args[0] == "off":
		b.Off = true
		return nil
	case len(args) != 0:
		return d.Err("store redis: breaker takes off or a block")
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		field := d.Val()
		if !d.NextArg() {
			return d.Errf("store redis: breaker %s needs a value", field)
		}
		v := d.Val()
		if d.NextArg() {
			return d.Errf("store redis: breaker %s takes one value", field)
		}
		switch field {
		case "failures":
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return d.Errf("store redis: breaker failures must be a positive integer, got %q", v)
			}
			b.Failures = n
		case "cooldown", "max_cooldown":
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return d.Errf("store redis: breaker %s must be a positive duration, got %q", field, v)
			}
			if field == "cooldown" {
				b.Cooldown = caddy.Duration(dur)
			} else {
				b.MaxCooldown = caddy.Duration(dur)
			}
		default:
			return d.Errf("store redis: breaker: unknown option %q (known: failures, cooldown, max_cooldown)", field)
		}
	}
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner     = (*Redis)(nil)
	_ caddy.Validator       = (*Redis)(nil)
	_ caddy.CleanerUpper    = (*Redis)(nil)
	_ caddyfile.Unmarshaler = (*Redis)(nil)
	_ caddy.Destructor      = (*Store)(nil)

	// The store contract (package stores): the store's capabilities, and
	// the module's (the store's, embedded, and its own).
	_ stores.Store       = (*Store)(nil)
	_ stores.Refunder    = (*Store)(nil)
	_ stores.Settler     = (*Store)(nil)
	_ stores.Pinner      = (*Store)(nil)
	_ stores.Releaser    = (*Store)(nil)
	_ stores.Allowancer  = (*Store)(nil)
	_ stores.Admin       = (*Store)(nil)
	_ stores.Store       = (*Redis)(nil)
	_ stores.Refunder    = (*Redis)(nil)
	_ stores.Settler     = (*Redis)(nil)
	_ stores.Pinner      = (*Redis)(nil)
	_ stores.Releaser    = (*Redis)(nil)
	_ stores.Allowancer  = (*Redis)(nil)
	_ stores.Admin       = (*Redis)(nil)
	_ stores.Keyed       = (*Redis)(nil)
	_ stores.Described   = (*Redis)(nil)
	_ stores.ErrorKind   = (*storeError)(nil)
	_ stores.ErrorKind   = (*circuitError)(nil)
	_ stores.RetryHinter = (*circuitError)(nil)
)
