package simulate

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestProgressLine: the progress line gives the lines, the rate and, for a
// file, the share read and the time left.
func TestProgressLine(t *testing.T) {
	for _, c := range []struct {
		lines      int64
		elapsed    time.Duration
		read, size int64
		want       string
	}{
		{1_500_000, 10 * time.Second, 50 << 20, 200 << 20, "1,500,000 lines, 150,000 lines/s, 25% read, about 30s left"},
		{1_500_000, 10 * time.Second, 0, 0, "1,500,000 lines, 150,000 lines/s"},
		{999, 2 * time.Second, 1, 3, "999 lines, 499 lines/s, 33% read, about 4s left"},
		{12_345_678, 100 * time.Second, 1 << 30, 30 << 30, "12,345,678 lines, 123,456 lines/s, 3% read, about 48m20s left"},
		{0, 0, 0, 10, "0 lines, 0 lines/s, 0% read"},
		{5, time.Second, 10, 10, "5 lines, 5 lines/s, 100% read, about 0s left"},
	} {
		if got := progressLine(c.lines, c.elapsed, c.read, c.size); got != c.want {
			t.Errorf("progressLine(%d, %v, %d, %d) = %q, want %q", c.lines, c.elapsed, c.read, c.size, got, c.want)
		}
	}
}

// TestProgressNeverOffTerminal: progress goes to standard error only when
// it is a terminal: never to a file or a pipe.
func TestProgressNeverOffTerminal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for _, out := range []*os.File{f, w} {
		if p := newProgress(out, nil, 0); p != nil {
			t.Errorf("%s: progress shown on a file that is not a terminal", out.Name())
		}
	}
}
