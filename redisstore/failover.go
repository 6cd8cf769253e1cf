package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// promotionGuard makes a Sentinel store leave the old master when the
// replica is promoted, not when the sentinels announce it. go-redis's
// failover client switches on +switch-master, which a sentinel publishes
// only after it has seen the promotion in the replica's INFO (polled every
// second during a failover): until then the old master, still a master,
// answers decisions that the new one never sees (docs/redis.md, "Sentinel
// and failover").
//
// The guard subscribes to every sentinel's failover events. When one selects
// a replica of this master (+selected-slave), the guard polls that replica's
// ROLE; when the replica is being promoted (+failover-state-wait-promotion)
// or answers ROLE master, the connections to the old master are retired and
// a dial to it (go-redis dials the address the sentinels give) waits, within
// the decision's deadline, for the promotion and then connects to the new
// master instead (an aborted failover lets the old master be dialled again).
type promotionGuard struct {
	tlsDial func(ctx context.Context, network, addr string) (net.Conn, error) // tls.go's; nil without TLS
	opt     *redis.FailoverOptions
	timeout time.Duration
	logger  *zap.Logger
	// promoted is called when decisions go to a promoted replica (the
	// store's breaker probes at once); nil: none.
	promoted func()

	mu      sync.Mutex
	conns   map[*trackedConn]string // open connections, and the address dialled
	fence   *fence                  // the failover in progress or the last one; nil: none
	subbed  map[string]bool         // sentinels subscribed to, by address
	pubsubs []*redis.PubSub
	clients []*redis.SentinelClient
	started bool
	stopped bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

// fence is one failover seen: old is the master's address, next the
// promoted replica's.
type fence struct {
	old, next string
	since     time.Time
	// left (under the guard's mu) once the old master's connections are
	// retired: dials to it wait for done.
	left bool
	// done is closed when the failover is decided: promoted (dials to old
	// go to next) or aborted (they go to old).
	done     chan struct{}
	promoted bool
}

// fenceLife is how long a promotion redirects dials of the old master's
// address: long after go-redis has switched (the sentinels' view moves
// within seconds), short enough that a later failover back to the old
// master that this guard missed is not countered for long.
const fenceLife = time.Minute

// rolePoll is the interval between two ROLE polls of a selected replica.
const rolePoll = 5 * time.Millisecond

// errPromotion is a dial's error while the failover it waited for was not
// decided within the decision's deadline.
var errPromotion = errors.New("redis: sentinel failover in progress: the replica's promotion is awaited")

// guards maps a failover client to its guard, from newClient to the store
// (newStoreWith) that starts and stops it.
var guards sync.Map // *redis.Client → *promotionGuard

// newGuardedFailoverClient builds the failover client of opt with a
// promotion guard dialling its connections.
func newGuardedFailoverClient(opt *redis.FailoverOptions, timeout time.Duration) *redis.Client {
	g := &promotionGuard{opt: opt, timeout: timeout, conns: map[*trackedConn]string{}, subbed: map[string]bool{}, stop: make(chan struct{})}
	g.tlsDial, opt.Dialer = opt.Dialer, g.dial
	c := redis.NewFailoverClient(opt)
	guards.Store(c, g)
	return c
}

// takeGuard returns c's promotion guard (nil if none) and forgets it.
func takeGuard(c redis.UniversalClient) *promotionGuard {
	fc, ok := c.(*redis.Client)
	if !ok {
		return nil
	}
	g, ok := guards.LoadAndDelete(fc)
	if !ok {
		return nil
	}
	return g.(*promotionGuard)
}

// closeClient closes a client that no store took (a configuration check).
func closeClient(c redis.UniversalClient) {
	takeGuard(c)
	_ = c.Close()
}

// start subscribes to the sentinels, and to those they know of, now and
// every few seconds.
func (g *promotionGuard) start(logger *zap.Logger, promoted func()) {
	if logger == nil {
		logger = zap.NewNop()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.logger, g.started, g.promoted = logger, true, promoted
	for _, a := range g.opt.SentinelAddrs {
		g.subscribeLocked(a)
	}
	g.wg.Add(1)
	go g.discover()
}

// close stops the guard.
func (g *promotionGuard) close() {
	g.mu.Lock()
	if g.stopped || !g.started {
		g.stopped = true
		g.mu.Unlock()
		return
	}
	g.stopped = true
	close(g.stop)
	pubsubs, clients := g.pubsubs, g.clients
	g.mu.Unlock()
	for _, p := range pubsubs {
		_ = p.Close()
	}
	for _, c := range clients {
		_ = c.Close()
	}
	g.wg.Wait()
}

// failoverChannels are the sentinel events the guard follows.
var failoverChannels = []string{
	"+selected-slave", "+failover-state-send-slaveof-noone", "+failover-state-wait-promotion", "+promoted-slave",
	"-failover-abort-not-elected", "-failover-abort-no-good-slave", "-failover-abort-slave-timeout", "+failover-end-for-timeout",
}

// sentinelOptions are the options of a connection to the sentinel at addr.
func (g *promotionGuard) sentinelOptions(addr string) *redis.Options {
	o := &redis.Options{Addr: addr, Username: g.opt.SentinelUsername, Password: g.opt.SentinelPassword, TLSConfig: g.opt.TLSConfig,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, MaxRetries: -1, PoolSize: 1}
	return o
}

func (g *promotionGuard) subscribeLocked(addr string) {
	if g.subbed[addr] || g.stopped {
		return
	}
	g.subbed[addr] = true
	c := redis.NewSentinelClient(g.sentinelOptions(addr))
	ps := c.Subscribe(context.Background(), failoverChannels...)
	g.clients, g.pubsubs = append(g.clients, c), append(g.pubsubs, ps)
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		for msg := range ps.Channel() {
			g.event(msg.Channel, msg.Payload)
		}
	}()
}

// discover subscribes to the sentinels the known ones report.
func (g *promotionGuard) discover() {
	defer g.wg.Done()
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		g.mu.Lock()
		clients := g.clients
		g.mu.Unlock()
		for _, c := range clients {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			others, err := c.Sentinels(ctx, g.opt.MasterName).Result()
			cancel()
			if err != nil {
				continue
			}
			g.mu.Lock()
			for _, o := range others {
				if o["ip"] != "" && o["port"] != "" {
					g.subscribeLocked(net.JoinHostPort(o["ip"], o["port"]))
				}
			}
			g.mu.Unlock()
			break
		}
		select {
		case <-g.stop:
			return
		case <-tick.C:
		}
	}
}

// event acts on one sentinel event. The payload of the events about a
// replica is "slave <ip>:<port> <ip> <port> @ <master name> <master ip>
// <master port>".
func (g *promotionGuard) event(channel, payload string) {
	f := strings.Fields(payload)
	if len(f) != 8 || f[0] != "slave" || f[4] != "@" || f[5] != g.opt.MasterName {
		return
	}
	replica, master := net.JoinHostPort(f[2], f[3]), net.JoinHostPort(f[6], f[7])
	switch channel {
	case "+selected-slave", "+failover-state-send-slaveof-noone":
		g.watch(master, replica)
	case "+failover-state-wait-promotion", "+promoted-slave":
		g.leaveOld(g.watch(master, replica))
	default: // an abort
		g.mu.Lock()
		fe := g.fence
		if fe != nil && fe.old == master && fe.next == replica {
			g.decideLocked(fe, false)
		}
		g.mu.Unlock()
	}
}

// watch returns the fence of the failover from master to replica, made (and
// the replica's ROLE polled) if it is new.
func (g *promotionGuard) watch(master, replica string) *fence {
	g.mu.Lock()
	defer g.mu.Unlock()
	if fe := g.fence; fe != nil && fe.old == master && fe.next == replica && (!isDone(fe.done) || fe.promoted) {
		return fe
	}
	if g.stopped {
		return nil
	}
	fe := &fence{old: master, next: replica, since: time.Now(), done: make(chan struct{})}
	if old := g.fence; old != nil {
		g.decideLocked(old, old.promoted)
	}
	g.fence = fe
	g.wg.Add(1)
	go g.pollRole(fe)
	return fe
}

// leaveOld retires the connections to fe's old master: from now on a dial
// to it waits for the promotion.
func (g *promotionGuard) leaveOld(fe *fence) {
	if fe == nil {
		return
	}
	g.mu.Lock()
	if g.fence != fe || fe.left || (isDone(fe.done) && !fe.promoted) {
		g.mu.Unlock()
		return
	}
	fe.left = true
	n := 0
	for c, addr := range g.conns {
		if addr == fe.old {
			c.retired.Store(true)
			n++
		}
	}
	g.mu.Unlock()
	g.logger.Info("redis sentinel failover: the old master is left as its replica is promoted",
		zap.String("master", fe.old), zap.String("promoted", fe.next), zap.Int("connections_retired", n))
}

// decideLocked ends fe's wait: promoted or not.
func (g *promotionGuard) decideLocked(fe *fence, promoted bool) {
	if isDone(fe.done) {
		return
	}
	fe.promoted = promoted
	close(fe.done)
}

func isDone(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// pollRole polls fe's replica's ROLE until it answers master (then the old
// master is left), the failover is decided otherwise, or the failover
// timeout (the sentinels' default, 3 minutes, bounds it) passes.
func (g *promotionGuard) pollRole(fe *fence) {
	defer g.wg.Done()
	c := redis.NewClient(&redis.Options{Addr: fe.next, Username: g.opt.Username, Password: g.opt.Password, TLSConfig: g.opt.TLSConfig,
		Dialer: g.netDial, DialTimeout: g.timeout, ReadTimeout: g.timeout, WriteTimeout: g.timeout, MaxRetries: -1, PoolSize: 1})
	defer c.Close()
	tick := time.NewTicker(rolePoll)
	defer tick.Stop()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
		role, err := c.Do(ctx, "ROLE").Slice()
		cancel()
		if err == nil && len(role) > 0 && role[0] == "master" {
			g.leaveOld(fe)
			g.mu.Lock()
			g.decideLocked(fe, true)
			g.mu.Unlock()
			g.logger.Info("redis sentinel failover: decisions go to the promoted replica",
				zap.String("master", fe.old), zap.String("promoted", fe.next), zap.Duration("since_selected", time.Since(fe.since)))
			if g.promoted != nil {
				g.promoted()
			}
			return
		}
		select {
		case <-g.stop:
			return
		case <-fe.done:
			return
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			g.mu.Lock()
			g.decideLocked(fe, false)
			g.mu.Unlock()
			return
		}
	}
}

// dial is the failover client's dialer: addr is the master the sentinels
// name.
func (g *promotionGuard) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	g.mu.Lock()
	fe := g.fence
	if fe != nil && (fe.old != addr || time.Since(fe.since) >= fenceLife) {
		fe = nil
	}
	wait := fe != nil && fe.left
	g.mu.Unlock()
	if wait {
		select {
		case <-fe.done:
		case <-ctx.Done():
			return nil, errPromotion
		}
	}
	if fe != nil && isDone(fe.done) && fe.promoted {
		addr = fe.next
	}
	c, err := g.netDial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	// The old master's connections may have been retired while this one
	// was being dialled: it must not outlive them.
	left := g.fence != nil && g.fence.left && g.fence.old == addr && time.Since(g.fence.since) < fenceLife &&
		!(isDone(g.fence.done) && !g.fence.promoted)
	if left || g.stopped && g.started {
		g.mu.Unlock()
		_ = c.Close()
		if left {
			return nil, errPromotion
		}
		return nil, redis.ErrClosed
	}
	t := &trackedConn{Conn: c, g: g}
	g.conns[t] = addr
	g.mu.Unlock()
	return t, nil
}

// netDial is go-redis's own dial (TCP keep-alive, TLS when configured),
// or the store's TLS dial (tls.go) when it has one.
func (g *promotionGuard) netDial(ctx context.Context, network, addr string) (net.Conn, error) {
	if g.tlsDial != nil {
		return g.tlsDial(ctx, network, addr)
	}
	d := &net.Dialer{Timeout: g.opt.DialTimeout, KeepAlive: 5 * time.Minute}
	if g.opt.TLSConfig == nil {
		return d.DialContext(ctx, network, addr)
	}
	td := &tls.Dialer{NetDialer: d, Config: g.opt.TLSConfig}
	return td.DialContext(ctx, network, addr)
}

// trackedConn is a connection of the failover client. go-redis's pool
// checks an idle connection's health through syscall.Conn before it hands
// it out: a retired connection fails that check, so the pool drops it
// instead of sending a decision on it; one in use finishes its exchange
// first (a decision in flight is not failed for it).
type trackedConn struct {
	net.Conn
	g       *promotionGuard
	retired atomic.Bool
	once    sync.Once
}

func (c *trackedConn) SyscallConn() (syscall.RawConn, error) {
	if c.retired.Load() {
		return nil, errPromotion
	}
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return uncheckedConn{}, nil // TLS: go-redis does not check it either
}

// uncheckedConn passes go-redis's health check without a look at the
// socket.
type uncheckedConn struct{}

func (uncheckedConn) Control(func(fd uintptr)) error    { return nil }
func (uncheckedConn) Read(func(fd uintptr) bool) error  { return nil }
func (uncheckedConn) Write(func(fd uintptr) bool) error { return nil }

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.g.mu.Lock()
		delete(c.g.conns, c)
		c.g.mu.Unlock()
	})
	return c.Conn.Close()
}
