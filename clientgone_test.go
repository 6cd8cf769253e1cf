package sluice

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// bodySizes are the body sizes around the read-ahead's first buffer and
// its bound.
var bodySizes = []int{1, readAheadFirst - 1, readAheadFirst, readAheadFirst + 1, readAheadMax - 1, readAheadMax, readAheadMax + 1, 1 << 20}

// sendRaw writes a POST of body to addr over HTTP/1.1, with a
// Content-Length or chunked (in pieces of 1000 bytes), and returns the
// connection.
func sendRaw(t *testing.T, addr string, body []byte, chunked bool) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(conn)
	fmt.Fprintf(w, "POST / HTTP/1.1\r\nHost: x\r\n")
	if !chunked {
		fmt.Fprintf(w, "Content-Length: %d\r\n\r\n", len(body))
		w.Write(body)
	} else {
		fmt.Fprintf(w, "Transfer-Encoding: chunked\r\n\r\n")
		for b := body; len(b) > 0; {
			n := min(len(b), 1000)
			fmt.Fprintf(w, "%x\r\n%s\r\n", n, b[:n])
			b = b[n:]
		}
		fmt.Fprintf(w, "0\r\n\r\n")
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return conn
}

// A client that sends its body whole (shorter than readAheadMax, with a
// Content-Length or chunked) and hangs up while the handler waits is
// noticed, through net/http's own server, which alone does not notice it
// before the body is read.
func TestClientWatchNoticesHangUp(t *testing.T) {
	noticed := make(chan bool, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := watchClient(r)
		select {
		case <-c.done():
		case <-time.After(5 * time.Second):
		}
		noticed <- c.stop()
	}))
	defer srv.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, chunked := range []bool{false, true} {
		for _, size := range bodySizes {
			if size >= readAheadMax {
				continue // the documented limit: noticed once the wait ends
			}
			body := make([]byte, size)
			for i := range body {
				body[i] = 'a' + byte(rng.IntN(26))
			}
			sendRaw(t, srv.Listener.Addr().String(), body, chunked).Close()
			if !<-noticed {
				t.Errorf("%d bytes (chunked %v), sent whole: the client's hanging up went unnoticed for 5 s", size, chunked)
			}
		}
	}
	// Clients that leave before or in the middle of sending a body longer
	// than the bound, having sent less than the bound.
	for _, sent := range []int{0, readAheadMax / 2, readAheadMax - 1} {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 1<<20)
		conn.Write(bytes.Repeat([]byte("a"), sent))
		conn.Close()
		if !<-noticed {
			t.Errorf("a client that hung up after sending %d bytes of 1 MiB went unnoticed for 5 s", sent)
		}
	}
}

// The next handler gets the body byte for byte, whatever part of it was
// read ahead: bodies around the first buffer and the bound, with a
// Content-Length or chunked, some of it still on its way when the wait
// ends.
func TestClientWatchHandsBodyOn(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := watchClient(r)
		time.Sleep(20 * time.Millisecond) // the wait
		if c.stop() {
			http.Error(w, "the client is there", http.StatusInternalServerError)
			return
		}
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
	}))
	defer srv.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, chunked := range []bool{false, true} {
		for _, size := range bodySizes {
			body := make([]byte, size)
			for i := range body {
				body[i] = 'a' + byte(rng.IntN(26))
			}
			req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
			if chunked {
				req.ContentLength = -1
				req.Body = io.NopCloser(bytes.NewReader(body))
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			sum := sha256.Sum256(body)
			if want := strconv.Itoa(size) + " " + hex.EncodeToString(sum[:]); resp.StatusCode != 200 || string(got) != want {
				t.Errorf("%d bytes (chunked %v): %d %q, want %q", size, chunked, resp.StatusCode, got, want)
			}
		}
	}
}

// A wait without a body to read ahead allocates nothing to watch its
// client.
func TestClientWatchNoBodyAllocations(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if n := testing.AllocsPerRun(100, func() {
		c := watchClient(r)
		select {
		case <-c.done():
		default:
		}
		_ = c.stop()
	}); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
