package simulate

import (
	"bufio"
	"errors"
	"io"
)

// Bounds of the traffic's lines and fields (docs/simulate.md, "Bounds"):
// a longer line or field is malformed, counted and skipped, and its bytes
// past the bound are read and dropped, never held.
const (
	// maxLogLine bounds an access log line: Caddy reads at most 1 MB of
	// request headers, which JSON escaping can grow.
	maxLogLine = 4 << 20
	// maxCSVLine bounds a CSV row.
	maxCSVLine = 64 << 10
	// maxCSVKey bounds a CSV key (a token, an API key, a JWT).
	maxCSVKey = 8 << 10
)

// lineReader reads lines of at most max bytes.
type lineReader struct {
	br  *bufio.Reader
	max int
	buf []byte
}

func newLineReader(r io.Reader, max int) *lineReader {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(r, 64<<10)
	}
	return &lineReader{br: br, max: max}
}

// next returns the next line without its line ending; the slice is valid
// until the following call. A line longer than the bound is returned as
// tooLong, empty. err is io.EOF after the last line.
func (l *lineReader) next() (line []byte, tooLong bool, err error) {
	l.buf = l.buf[:0]
	for {
		chunk, err := l.br.ReadSlice('\n')
		if !tooLong {
			if len(l.buf)+len(chunk) > l.max+2 { // +2: the line ending
				tooLong, l.buf = true, l.buf[:0]
			} else {
				l.buf = append(l.buf, chunk...)
			}
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && (len(l.buf) > 0 || tooLong):
			err = nil // the last line, without a newline
		case err != nil:
			return nil, false, err
		}
		if tooLong {
			return nil, true, nil
		}
		line = l.buf
		if n := len(line); n > 0 && line[n-1] == '\n' {
			line = line[:n-1]
			if n > 1 && line[n-2] == '\r' {
				line = line[:n-2]
			}
		}
		if len(line) > l.max {
			return nil, true, nil
		}
		return line, false, nil
	}
}
