// Command benchtool is the Go half of the benchmark harness (bench/run.sh,
// `make bench`): the small jobs that are awkward in a shell script. Run it
// without arguments for its subcommands (usageText); bench/README.md says
// where the harness uses each.
//
// It uses only the standard library and the redisstore package (the script).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/caddy-sluice/redisstore"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch args := os.Args[2:]; os.Args[1] {
	case "lua":
		_, err = io.WriteString(os.Stdout, redisstore.LuaScript)
	case "lualib":
		_, err = io.WriteString(os.Stdout, redisstore.LuaLibrary)
	case "probelib":
		err = probeLib()
	case "floorlib":
		err = floorLib()
	case "luafn":
		_, err = io.WriteString(os.Stdout, redisstore.LuaFunction+"\n")
	case "ports":
		err = ports(args)
	case "wait":
		err = wait(args)
	case "snap":
		err = snap(args)
	case "fetch":
		err = fetch(args)
	case "cpu":
		err = cpu(args)
	case "report":
		err = report(args)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtool:", err)
		os.Exit(1)
	}
}

// usageText lists the subcommands.
const usageText = `usage: benchtool <subcommand>

  benchtool lua                 print the decision as an EVAL script (redisstore.LuaScript)
  benchtool lualib              print the production decision library (redisstore.LuaLibrary)
  benchtool probelib            print the production library with the probe functions
                                of bench/redis-probe.sh (probe.go)
  benchtool luafn               print the name of its function (redisstore.LuaFunction)
  benchtool floorlib            print a library of the floor function alone (probe.go's floorFn,
                                named sluice_floor)
  benchtool ports N             print N free loopback TCP ports
  benchtool wait URL SECONDS    wait until URL answers (any status)
  benchtool snap ADMIN_URL      one line of counters from Caddy's admin endpoint:
                                Go heap mallocs and bytes (/debug/vars) and
                                Sluice's decision and store error counters (/metrics)
  benchtool fetch URL FILE      save URL's body to FILE (a pprof profile)
  benchtool cpu PID...          CPU ticks so far: the machine's busy and steal
                                time (/proc/stat) and the given processes' (/proc/PID/stat)
  benchtool report DIR          the Markdown report of a run from DIR's raw files
`

func usage() {
	fmt.Fprint(os.Stderr, usageText)
	os.Exit(2)
}

// ports holds N listeners open at once (so the ports differ), then closes
// them and prints the ports.
func ports(args []string) error {
	if len(args) != 1 {
		usage()
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 1 {
		return fmt.Errorf("ports: bad count %q", args[0])
	}
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer l.Close()
		out = append(out, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	fmt.Println(strings.Join(out, " "))
	return nil
}

func wait(args []string) error {
	if len(args) != 2 {
		usage()
	}
	secs, err := strconv.ParseFloat(args[1], 64)
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(time.Duration(secs * float64(time.Second)))
	for {
		resp, err := client.Get(args[0])
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer within %vs: %v", args[0], args[1], err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func fetch(args []string) error {
	if len(args) != 2 {
		usage()
	}
	resp, err := http.Get(args[0])
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", args[0], resp.Status)
	}
	f, err := os.Create(args[1])
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// cpu prints "busy steal T1 T2 ..." in clock ticks: the machine's busy
// time (user, nice, system, irq, softirq over all CPUs), its steal time, and
// the user+system time of each given process (0 for one that is gone).
func cpu(args []string) error {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return err
	}
	line, _, _ := strings.Cut(string(stat), "\n")
	fs := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(fs) < 9 || fs[0] != "cpu" {
		return fmt.Errorf("/proc/stat: unexpected %q", line)
	}
	v := func(i int) uint64 { n, _ := strconv.ParseUint(fs[i], 10, 64); return n }
	out := []string{strconv.FormatUint(v(1)+v(2)+v(3)+v(6)+v(7), 10), fs[8]}
	for _, pid := range args {
		var ticks uint64
		if b, err := os.ReadFile("/proc/" + pid + "/stat"); err == nil {
			// Fields after the command name (which may hold spaces):
			// state is field 3, utime 14, stime 15.
			f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
			if len(f) > 12 {
				u, _ := strconv.ParseUint(f[11], 10, 64)
				s, _ := strconv.ParseUint(f[12], 10, 64)
				ticks = u + s
			}
		}
		out = append(out, strconv.FormatUint(ticks, 10))
	}
	fmt.Println(strings.Join(out, " "))
	return nil
}

// snap prints "mallocs=N bytes=N allowed=N refused=N failed=N store_errors=N".
func snap(args []string) error {
	if len(args) != 1 {
		usage()
	}
	base := strings.TrimRight(args[0], "/")
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(base + "/debug/vars")
	if err != nil {
		return err
	}
	var vars struct {
		Memstats struct {
			Mallocs    uint64
			TotalAlloc uint64
		} `json:"memstats"`
	}
	err = json.NewDecoder(resp.Body).Decode(&vars)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("/debug/vars: %v", err)
	}
	var allowed, refused, failed, storeErrs float64
	if resp, err := client.Get(base + "/metrics"); err == nil {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			name, labels, value, ok := metricLine(line)
			if !ok {
				continue
			}
			switch name {
			case "caddy_rate_limit_decisions_total":
				switch {
				case strings.Contains(labels, `outcome="allowed"`):
					allowed += value
				case strings.Contains(labels, `outcome="refused"`):
					refused += value
				case strings.Contains(labels, `outcome="failed_`):
					failed += value
				}
			case "caddy_rate_limit_store_errors_total":
				storeErrs += value
			}
		}
		resp.Body.Close()
	}
	fmt.Printf("mallocs=%d bytes=%d allowed=%.0f refused=%.0f failed=%.0f store_errors=%.0f\n",
		vars.Memstats.Mallocs, vars.Memstats.TotalAlloc, allowed, refused, failed, storeErrs)
	return nil
}

// metricLine splits a Prometheus text-format sample line.
func metricLine(line string) (name, labels string, value float64, ok bool) {
	if line == "" || line[0] == '#' {
		return "", "", 0, false
	}
	sp := strings.LastIndexByte(line, ' ')
	if sp < 0 {
		return "", "", 0, false
	}
	v, err := strconv.ParseFloat(line[sp+1:], 64)
	if err != nil {
		return "", "", 0, false
	}
	head := line[:sp]
	if i := strings.IndexByte(head, '{'); i >= 0 {
		return head[:i], head[i:], v, true
	}
	return head, "", v, true
}
