package telemetry

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestSampledLog: at most n lines per period; the lines dropped are
// counted and reported by the next line written, in the next period.
func TestSampledLog(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	logger := zap.New(core)
	l := NewSampledLog(2, time.Hour)
	for range 5 {
		l.Log(logger, zap.InfoLevel, "line")
	}
	if n := logs.Len(); n != 2 {
		t.Fatalf("%d lines written in one period, want 2", n)
	}
	if n := l.Suppressed(); n != 3 {
		t.Fatalf("%d lines suppressed, want 3", n)
	}
	l.Restart()
	l.Log(logger, zap.InfoLevel, "next")
	all := logs.All()
	if len(all) != 3 || all[2].ContextMap()[SuppressedFieldName] != int64(3) {
		t.Fatalf("the next period's line: %+v, want %s 3", all[len(all)-1].ContextMap(), SuppressedFieldName)
	}
	if n := l.Suppressed(); n != 0 {
		t.Fatalf("%d suppressed after a line was written, want 0", n)
	}
}
