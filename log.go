package sluice

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// sampledLog writes at most n log lines per period and counts the lines it
// drops, reported as suppressed_since_last in the next line it writes, so
// that an outage, a flood of bad values or an attack cannot flood the log.
// A period starts with the first line written after the previous one ended.
type sampledLog struct {
	n          int64
	period     int64        // nanoseconds
	start      atomic.Int64 // Unix nanoseconds: when the current period began
	count      atomic.Int64 // lines asked for in the current period
	suppressed atomic.Int64
}

func newSampledLog(n int64, period time.Duration) *sampledLog {
	l := &sampledLog{n: n, period: int64(period)}
	l.count.Store(n) // no line before the first period starts
	return l
}

// The rate-limited log lines.
const (
	refusalLines        = 10 // per second: refusals, would-be refusals, ambiguous keys
	storeErrorInterval  = 5 * time.Second
	badValueInterval    = time.Minute // per zone: unusable per-request values
	suppressedFieldName = "suppressed_since_last"
)

// allow reports whether a line may be written at now (Unix nanoseconds),
// counting it as suppressed when not. The caller that starts a period
// writes its first line.
func (l *sampledLog) allow(now int64) bool {
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

// check returns the entry of a line at level lvl, or nil when the line is
// suppressed or the level is off. The caller builds the line's fields only
// for an entry, and writes it with write.
func (l *sampledLog) check(logger *zap.Logger, lvl zapcore.Level, msg string, now time.Time) *zapcore.CheckedEntry {
	if !l.allow(now.UnixNano()) {
		return nil
	}
	return logger.Check(lvl, msg)
}

// write writes an entry check returned, with the count of the lines
// suppressed since the last one written.
func (l *sampledLog) write(ce *zapcore.CheckedEntry, fields ...zap.Field) {
	ce.Write(append(fields, zap.Int64(suppressedFieldName, l.suppressed.Swap(0)))...)
}

// log checks and writes a line whose fields cost nothing to build.
func (l *sampledLog) log(logger *zap.Logger, lvl zapcore.Level, msg string, fields ...zap.Field) {
	if ce := l.check(logger, lvl, msg, time.Now()); ce != nil {
		l.write(ce, fields...)
	}
}
