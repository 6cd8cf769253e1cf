// Package redisstore is Sluice's shared store: rate limit state in Redis
// (standalone, Sentinel or Cluster), decided atomically where the data is by
// one Lua script per request, with the time read from Redis, under a tight
// timeout. Every Caddy instance pointed at the same Redis enforces one limit
// together.
//
// It satisfies the store contract of package sluice structurally (it never
// imports it).
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
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
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
)

// Redis is the shared store. Configure exactly one of URL (a standalone
// server, or Sentinel with the redis+sentinel scheme) or Cluster.
type Redis struct {
	// URL of the Redis server: redis://[user:password@]host:port[/db],
	// rediss:// for TLS, or for Sentinel
	// redis+sentinel://[user:password@]sentinelhost:port[/db]?master_name=<name>[&addr=<sentinel2:port>...]
	// (rediss+sentinel for TLS; the user and password in a Sentinel URL
	// are the Sentinels' own, the master's go in the password=/username=
	// query parameters). Placeholders such as {env.REDIS_URL} are
	// resolved at Provision; the URL is never logged.
	URL string `json:"url,omitempty"`

	// Cluster lists seed nodes (host:port) of a Redis Cluster.
	Cluster []string `json:"cluster,omitempty"`

	// Username and Password authenticate to Cluster nodes (for a URL, put
	// them in the URL). Placeholders are resolved at Provision.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`

	// TLS connects to Cluster nodes over TLS (a URL says so with rediss).
	TLS bool `json:"tls,omitempty"`

	// Timeout bounds each decision end to end: waiting for a pooled
	// connection, connecting, the script and its NOSCRIPT retry. When it
	// passes, the zones' fail policy decides. Default: 100ms (measured:
	// see the README's Redis store section).
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// KeyPrefix starts every key Sluice writes. Default: "sluice:v1:".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// PoolSize is the number of connections per node. Default: go-redis's
	// (10 per CPU).
	PoolSize int `json:"pool_size,omitempty"`

	store   *Store
	poolKey string
	logger  *zap.Logger
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

	cfg := connConfig{URL: rawURL, Cluster: r.Cluster, Username: username, Password: password, TLS: r.TLS,
		Timeout: time.Duration(r.Timeout), Prefix: r.KeyPrefix, PoolSize: r.PoolSize}
	client, cluster, err := cfg.newClient()
	if err != nil {
		return err
	}
	_ = client.Close() // only a check; the pooled client is made below once per configuration
	r.poolKey = cfg.key()
	v, loaded, err := pool.LoadOrNew(r.poolKey, func() (caddy.Destructor, error) {
		c, _, err := cfg.newClient()
		if err != nil {
			return nil, err
		}
		return newStore(c, cluster, r.KeyPrefix, time.Duration(r.Timeout)), nil
	})
	if err != nil {
		return err
	}
	r.store = v.(*Store)
	if !loaded {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := r.store.client.Ping(pctx).Err(); err != nil {
			r.logger.Warn("redis is not reachable yet; decisions follow each zone's fail policy until it is",
				zap.String("target", cfg.describe()), zap.Error(redactErr(err, rawURL, password)))
		}
	}
	return nil
}

// validate checks what can be checked before placeholders are resolved.
func (r *Redis) validate() error {
	switch {
	case r.URL == "" && len(r.Cluster) == 0:
		return errors.New("store redis: url or cluster is required")
	case r.URL != "" && len(r.Cluster) > 0:
		return errors.New("store redis: set url or cluster, not both")
	case r.Timeout < 0:
		return fmt.Errorf("store redis: timeout must be positive, got %s", time.Duration(r.Timeout))
	case r.PoolSize < 0:
		return fmt.Errorf("store redis: pool_size must be positive, got %d", r.PoolSize)
	case strings.ContainsAny(r.KeyPrefix, "{}"):
		return fmt.Errorf("store redis: key_prefix %q must not contain '{' or '}' (they would change the Cluster hash tag)", r.KeyPrefix)
	}
	for _, a := range r.Cluster {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("store redis: cluster address %q: %v", a, err)
		}
	}
	return nil
}

// Validate checks the configuration.
func (r *Redis) Validate() error { return r.validate() }

// Cleanup releases this configuration's hold on the shared client.
func (r *Redis) Cleanup() error {
	if r.poolKey == "" {
		return nil
	}
	_, err := pool.Delete(r.poolKey)
	r.poolKey = ""
	return err
}

// Key identifies the store for the zone registry: the connection target and
// key prefix, never a secret.
func (r *Redis) Key() string {
	return "redis " + r.poolKey
}

// Take implements the store contract (see Store.Take).
func (r *Redis) Take(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
	return r.store.Take(ctx, reqs, out)
}

// Store returns the shared store (for tests and the admin API).
func (r *Redis) Store() *Store { return r.store }

// connConfig is a store's resolved connection configuration.
type connConfig struct {
	URL      string
	Cluster  []string
	Username string
	Password string
	TLS      bool
	Timeout  time.Duration
	Prefix   string
	PoolSize int
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
		if c.TLS {
			opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		bound(c.Timeout, &opt.ContextTimeoutEnabled, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.PoolTimeout,
			&opt.MaxRetries, &opt.DialerRetries, &opt.DialerRetryTimeout)
		opt.MaxRedirects = 2
		return redis.NewClusterClient(opt), true, nil
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return nil, false, errors.New("store redis: url: malformed URL")
	}
	switch u.Scheme {
	case "redis+sentinel", "rediss+sentinel":
		u.Scheme = strings.TrimSuffix(u.Scheme, "+sentinel")
		opt, err := redis.ParseFailoverURL(u.String())
		if err != nil {
			return nil, false, fmt.Errorf("store redis: url: %v", redactErr(err, c.URL, c.Password))
		}
		if opt.MasterName == "" {
			return nil, false, errors.New("store redis: url: a Sentinel URL needs ?master_name=<name>")
		}
		if c.PoolSize > 0 {
			opt.PoolSize = c.PoolSize
		}
		bound(c.Timeout, &opt.ContextTimeoutEnabled, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.PoolTimeout,
			&opt.MaxRetries, &opt.DialerRetries, &opt.DialerRetryTimeout)
		return redis.NewFailoverClient(opt), false, nil
	case "redis", "rediss", "unix":
		opt, err := redis.ParseURL(c.URL)
		if err != nil {
			return nil, false, fmt.Errorf("store redis: url: %v", redactErr(err, c.URL, c.Password))
		}
		if c.PoolSize > 0 {
			opt.PoolSize = c.PoolSize
		}
		bound(c.Timeout, &opt.ContextTimeoutEnabled, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.PoolTimeout,
			&opt.MaxRetries, &opt.DialerRetries, &opt.DialerRetryTimeout)
		return redis.NewClient(opt), false, nil
	}
	return nil, false, fmt.Errorf("store redis: url: unsupported scheme %q (use redis://, rediss://, redis+sentinel:// or rediss+sentinel://)", u.Scheme)
}

// bound makes every wait of a go-redis client honour the decision timeout:
// the context's deadline governs socket I/O, each dial, read, write and pool
// wait is capped at the timeout, command retries are off (a retry only
// spends the same deadline), and a refused dial is retried at most once,
// 1ms later, instead of go-redis's default of five times 100ms.
func bound(t time.Duration, ctxTimeout *bool, dial, read, write, poolWait *time.Duration, retries, dialRetries *int, dialBackoff *time.Duration) {
	*ctxTimeout = true
	*dial, *read, *write, *poolWait = t, t, t, t
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

// UnmarshalCaddyfile sets up the store from Caddyfile tokens. Syntax:
//
//	store redis [<url>] {
//	    url        <url>
//	    cluster    <host:port>...
//	    username   <name>
//	    password   <password>
//	    tls
//	    timeout    <duration>
//	    key_prefix <string>
//	    pool_size  <n>
//	}
func (r *Redis) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the store's name
	if d.NextArg() {
		r.URL = d.Val()
		if d.NextArg() {
			return d.ArgErr()
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
		one := func() (string, error) {
			if len(args) != 1 {
				return "", d.Errf("store redis: %s takes one value", field)
			}
			return args[0], nil
		}
		switch field {
		case "url":
			v, err := one()
			if err != nil {
				return err
			}
			if r.URL != "" {
				return d.Err("store redis: url given twice")
			}
			r.URL = v
		case "cluster":
			if len(args) == 0 {
				return d.Err("store redis: cluster needs at least one host:port")
			}
			r.Cluster = args
		case "username":
			v, err := one()
			if err != nil {
				return err
			}
			r.Username = v
		case "password":
			v, err := one()
			if err != nil {
				return err
			}
			r.Password = v
		case "tls":
			if len(args) != 0 {
				return d.Err("store redis: tls takes no value")
			}
			r.TLS = true
		case "timeout":
			v, err := one()
			if err != nil {
				return err
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return d.Errf("store redis: timeout must be a positive duration, got %q", v)
			}
			r.Timeout = caddy.Duration(dur)
		case "key_prefix":
			v, err := one()
			if err != nil {
				return err
			}
			r.KeyPrefix = v
		case "pool_size":
			v, err := one()
			if err != nil {
				return err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return d.Errf("store redis: pool_size must be a positive integer, got %q", v)
			}
			r.PoolSize = n
		default:
			return d.Errf("store redis: unknown option %q (known: url, cluster, username, password, tls, timeout, key_prefix, pool_size)", field)
		}
	}
	if err := r.validate(); err != nil {
		return d.Err(err.Error())
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
)
