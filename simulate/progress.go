package simulate

import (
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/term"
)

// progress shows a long replay's progress on one line of a terminal:
// first after a second, then once a second, erased at the end.
type progress struct {
	out   *os.File
	read  *atomic.Int64
	size  int64
	start time.Time
	next  time.Time
	shown bool
}

// newProgress returns the progress of a replay reading a traffic of size
// bytes (0: unknown) whose bytes read are counted in read; nil, showing
// nothing, unless out is a terminal.
func newProgress(out *os.File, read *atomic.Int64, size int64) *progress {
	if out == nil || !term.IsTerminal(int(out.Fd())) {
		return nil
	}
	now := time.Now()
	return &progress{out: out, read: read, size: size, start: now, next: now.Add(time.Second)}
}

// update shows the lines read so far, at most once a second.
func (p *progress) update(lines int64) {
	if p == nil {
		return
	}
	now := time.Now()
	if now.Before(p.next) {
		return
	}
	p.next = now.Add(time.Second)
	var read int64
	if p.read != nil {
		read = p.read.Load()
	}
	fmt.Fprintf(p.out, "\r\033[K%s", progressLine(lines, now.Sub(p.start), read, p.size))
	p.shown = true
}

// done erases the progress line.
func (p *progress) done() {
	if p != nil && p.shown {
		fmt.Fprint(p.out, "\r\033[K")
	}
}

// progressLine says how far a replay is: the lines, the rate and, for a
// file of known size, the share read and the time left at the rate so far.
func progressLine(lines int64, elapsed time.Duration, read, size int64) string {
	rate := int64(0)
	if elapsed > 0 {
		rate = int64(float64(lines) / elapsed.Seconds())
	}
	s := thousands(lines) + " lines, " + thousands(rate) + " lines/s"
	if size <= 0 {
		return s
	}
	read = min(read, size)
	s += fmt.Sprintf(", %d%% read", read*100/size)
	if read > 0 && elapsed > 0 {
		left := time.Duration(float64(elapsed) * float64(size-read) / float64(read))
		s += ", about " + left.Round(time.Second).String() + " left"
	}
	return s
}

// thousands writes n with a comma every three digits.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
