// Package telemetry holds what Sluice tells operators beside its answers:
// the Prometheus collectors (metrics.go; the root resolves each zone's
// counters) and the sampled log, whose lines an outage or an attack
// cannot flood.
package telemetry

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// SampledLog writes at most n log lines per period and counts the lines it
// drops, reported as suppressed_since_last in the next line it writes, so
// that an outage, a flood of bad values or an attack cannot flood the log.
// A period starts with the first line written after the previous one ended.
type SampledLog struct {
	n          int64
	period     int64        // nanoseconds
	start      atomic.Int64 // Unix nanoseconds: when the current period began
	count      atomic.Int64 // lines asked for in the current period
	suppressed atomic.Int64
}

// NewSampledLog returns a log of at most n lines per period.
func NewSampledLog(n int64, period time.Duration) *SampledLog {
	l := &SampledLog{n: n, period: int64(period)}
	l.count.Store(n) // no line before the first period starts
	return l
}

// The rate-limited log lines.
const (
	RefusalLines        = 10 // per second: refusals, would-be refusals, ambiguous keys
	StoreErrorInterval  = 5 * time.Second
	BadValueInterval    = time.Minute // per zone: unusable per-request values
	SuppressedFieldName = "suppressed_since_last"
)

// allow reports whether a line may be written at now (Unix nanoseconds),
// counting it as suppressed when not. The caller that starts a period
// writes its first line.
func (l *SampledLog) allow(now int64) bool {
	if start := l.start.Load(); now-start >= l.period && l.start.CompareAndSwap(start, now) {
		l.count.Store(1)
		return true
	}
	if l.count.Add(1) > l.n {
		l.suppressed.Add(1)
		return false
	}
	return true
}

// Check returns the entry of a line at level lvl, or nil when the line is
// suppressed or the level is off. The caller builds the line's fields only
// for an entry, and writes it with Write.
func (l *SampledLog) Check(logger *zap.Logger, lvl zapcore.Level, msg string, now time.Time) *zapcore.CheckedEntry {
	if !l.allow(now.UnixNano()) {
		return nil
	}
	return logger.Check(lvl, msg)
}

// Write writes an entry Check returned, with the count of the lines
// suppressed since the last one written.
func (l *SampledLog) Write(ce *zapcore.CheckedEntry, fields ...zap.Field) {
	ce.Write(append(fields, zap.Int64(SuppressedFieldName, l.suppressed.Swap(0)))...)
}

// Log checks and writes a line whose fields cost nothing to build.
func (l *SampledLog) Log(logger *zap.Logger, lvl zapcore.Level, msg string, fields ...zap.Field) {
	if ce := l.Check(logger, lvl, msg, time.Now()); ce != nil {
		l.Write(ce, fields...)
	}
}

// Suppressed returns the lines suppressed since the last one written.
func (l *SampledLog) Suppressed() int64 { return l.suppressed.Load() }

// Restart ends the current period: the next line starts a new one (a
// test's period gone by).
func (l *SampledLog) Restart() { l.start.Store(0) }
