package caddytest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// promServer is a real Prometheus (Debian's prometheus package) on a free
// loopback port, its data and log in a temp dir, stopped by t.Cleanup.
type promServer struct {
	url string
	log string
}

// startPrometheus starts Prometheus with config (a prometheus.yml) and
// waits until it is ready. A missing prometheus binary fails the test:
// scripts/ensure-prometheus.sh installs it (make test runs it).
func startPrometheus(t *testing.T, dir, config string) *promServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus is not on PATH: run scripts/ensure-prometheus.sh (make test does; it installs Debian's prometheus package as root): %v", err)
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
	p := &promServer{url: "http://" + addr, log: filepath.Join(dir, "prometheus.log")}
	logf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = promProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("starting prometheus: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := c.Get(p.url + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-done:
			t.Fatalf("prometheus exited at start; its log:\n%s", p.logTail())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus on %s not ready after 20s (%v); its log:\n%s", addr, err, p.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (p *promServer) logTail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// sample is one series of an instant query's answer.
type sample struct {
	labels map[string]string
	value  float64
}

// query evaluates expr now through the HTTP API (/api/v1/query) and returns
// its vector; an error (a query Prometheus refuses) is returned as such.
func (p *promServer) query(expr string) ([]sample, error) {
	var out struct {
		Status    string `json:"status"`
		Error     string `json:"error"`
		ErrorType string `json:"errorType"`
		Data      struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := p.getJSON("/api/v1/query?query="+url.QueryEscape(expr), &out); err != nil {
		return nil, err
	}
	if out.Status != "success" {
		return nil, fmt.Errorf("%s: %s", out.ErrorType, out.Error)
	}
	if out.Data.ResultType != "vector" {
		return nil, fmt.Errorf("result type %s, want vector", out.Data.ResultType)
	}
	var res []sample
	for _, r := range out.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("value %v: %v", r.Value[1], err)
		}
		res = append(res, sample{labels: r.Metric, value: v})
	}
	return res, nil
}

func (p *promServer) getJSON(path string, v any) error {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(p.url + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %v in %.300s", path, err, b)
	}
	return nil
}

// alertStates returns the state (pending, firing) of each active alert by
// name, from /api/v1/alerts, counting only alerts whose labels ours keeps.
func (p *promServer) alertStates(ours func(map[string]string) bool) (map[string]string, error) {
	var out struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := p.getJSON("/api/v1/alerts", &out); err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, a := range out.Data.Alerts {
		if ours(a.Labels) && m[a.Labels["alertname"]] != "firing" {
			m[a.Labels["alertname"]] = a.State
		}
	}
	return m, nil
}

// ruleHealth returns each rule's health and last error from /api/v1/rules.
func (p *promServer) ruleHealth() (map[string]string, error) {
	var out struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := p.getJSON("/api/v1/rules", &out); err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, g := range out.Data.Groups {
		for _, r := range g.Rules {
			m[r.Name] = r.Health + " " + r.LastError
		}
	}
	return m, nil
}

// positive reports whether one of samples, kept by ours, has a finite
// value above 0.
func positive(samples []sample, ours func(map[string]string) bool) bool {
	for _, s := range samples {
		if ours(s.labels) && s.value > 0 && !math.IsInf(s.value, 0) && !math.IsNaN(s.value) {
			return true
		}
	}
	return false
}

// anyOurs reports whether one of samples is kept by ours.
func anyOurs(samples []sample, ours func(map[string]string) bool) bool {
	for _, s := range samples {
		if ours(s.labels) {
			return true
		}
	}
	return false
}

// zonesOf lists the labels of samples, for messages.
func zonesOf(samples []sample) string {
	var zs []string
	for _, s := range samples {
		zs = append(zs, fmt.Sprint(s.labels))
	}
	return strings.Join(zs, " ")
}

// labelValues returns the values of label among the series match selects
// (/api/v1/label/<label>/values), as Grafana's label_values(match, label).
func (p *promServer) labelValues(label, match string) ([]string, error) {
	var out struct {
		Status string   `json:"status"`
		Error  string   `json:"error"`
		Data   []string `json:"data"`
	}
	if err := p.getJSON("/api/v1/label/"+url.PathEscape(label)+"/values?match[]="+url.QueryEscape(match), &out); err != nil {
		return nil, err
	}
	if out.Status != "success" {
		return nil, fmt.Errorf("label %s of %s: %s", label, match, out.Error)
	}
	return out.Data, nil
}
