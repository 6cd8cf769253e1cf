// Package observability_test checks the Grafana dashboard and the Prometheus
// alert rules of this folder: promtool's own checks and unit tests, the
// runbook links, and that the dashboard imports as is and shows every
// metric. caddytest/prometheus_test.go runs every query against a real
// Prometheus scraping a real Caddy.
package observability_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// runbookBase starts every alert's runbook_url: the docs section follows #.
const runbookBase = "https://github.com/sluicehq/caddy-sluice/blob/main/docs/operating.md#"

// promtool returns promtool's path; missing, the test fails (never skips),
// as a missing redis-server fails the Redis tests.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not on PATH: run scripts/ensure-prometheus.sh (make test does; it installs Debian's prometheus package as root): %v", err)
	}
	return p
}

// TestAlertRulesPromtool: promtool accepts the rules and their unit tests
// pass (each alert fires in one case and stays quiet in another).
func TestAlertRulesPromtool(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", "sluice-alerts.yml"},
		{"test", "rules", "sluice-alerts.test.yml"},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		} else {
			t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		}
	}
}

// Rule is one rule of sluice-alerts.yml.
type Rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func readRules(t *testing.T) []Rule {
	t.Helper()
	var f struct {
		Groups []struct {
			Rules []Rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	readYAML(t, "sluice-alerts.yml", &f)
	var out []Rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatal("sluice-alerts.yml: no rules read")
	}
	return out
}

func readYAML(t *testing.T, name string, v any) {
	t.Helper()
	raw, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// sections returns docs/operating.md's headings by GitHub anchor, each with
// the text up to the next heading.
func sections(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	cur := ""
	for _, l := range strings.Split(string(raw), "\n") {
		if h := strings.TrimLeft(l, "#"); len(h) < len(l) && strings.HasPrefix(h, " ") {
			cur = slug(h)
			out[cur] = ""
			continue
		}
		if cur != "" {
			out[cur] += l + "\n"
		}
	}
	return out
}

// slug is GitHub's anchor for a heading (as docs_test.go's).
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestAlertRulesRunbooks: every alert has a severity, a summary and a
// runbook_url to a section of docs/operating.md named after it that says
// what to do; the unit tests make every alert fire once and stay quiet
// once.
func TestAlertRulesRunbooks(t *testing.T) {
	secs := sections(t)
	seen := map[string]bool{}
	for _, r := range readRules(t) {
		if r.Alert == "" {
			continue
		}
		if seen[r.Alert] {
			t.Errorf("alert %s defined twice", r.Alert)
		}
		seen[r.Alert] = true
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			t.Errorf("alert %s: severity %q, want critical or warning", r.Alert, s)
		}
		if r.Annotations["summary"] == "" {
			t.Errorf("alert %s: no summary annotation", r.Alert)
		}
		url := r.Annotations["runbook_url"]
		anchor, ok := strings.CutPrefix(url, runbookBase)
		if !ok || anchor != strings.ToLower(r.Alert) {
			t.Errorf("alert %s: runbook_url %q, want %s%s", r.Alert, url, runbookBase, strings.ToLower(r.Alert))
			continue
		}
		text, ok := secs[anchor]
		if !ok {
			t.Errorf("alert %s: docs/operating.md has no heading #%s (its runbook)", r.Alert, anchor)
		} else if len(strings.Fields(text)) < 30 || !strings.Contains(text, "**Do**") {
			t.Errorf("alert %s: the runbook #%s says too little (%d words, want a **Do** part): %q", r.Alert, anchor, len(strings.Fields(text)), text)
		}
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	readYAML(t, "sluice-alerts.test.yml", &tests)
	fired, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if !seen[a.Alertname] {
				t.Errorf("sluice-alerts.test.yml tests an alert the rules do not define: %s", a.Alertname)
			}
			if len(a.ExpAlerts) > 0 {
				fired[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for name := range seen {
		if !fired[name] || !quiet[name] {
			t.Errorf("sluice-alerts.test.yml: alert %s has a firing case %v and a quiet case %v; want both", name, fired[name], quiet[name])
		}
	}
}

// metric is a row of docs/operating.md's metrics table.
type metric struct {
	kind   string // counter, gauge, histogram
	labels string // the labels cell: `zone`, `outcome`
}

// metricsTable returns the metrics docs/operating.md's table lists.
func metricsTable(t *testing.T) map[string]metric {
	t.Helper()
	raw, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]metric{}
	for _, l := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(l, "| `caddy_rate_limit_") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		out[strings.Trim(strings.TrimSpace(cells[0]), "`")] = metric{kind: strings.TrimSpace(cells[1]), labels: strings.TrimSpace(cells[2])}
	}
	if len(out) < 20 {
		t.Fatalf("docs/operating.md: only %d metrics read from the table", len(out))
	}
	return out
}

var metricName = regexp.MustCompile(`caddy_rate_limit_[a-z_]+`)

// metricsIn returns the metrics expr reads, histogram series named by
// their histogram; it fails the test for a name the table does not list
// (a typo would make a panel or an alert silently empty).
func metricsIn(t *testing.T, table map[string]metric, where, expr string) []string {
	t.Helper()
	var out []string
	for _, m := range metricName.FindAllString(expr, -1) {
		name := m
		for _, suf := range []string{"_bucket", "_count", "_sum"} {
			if base, ok := strings.CutSuffix(m, suf); ok && table[base].kind == "histogram" {
				name = base
			}
		}
		if _, ok := table[name]; !ok {
			t.Errorf("%s reads %s, which is not a Sluice metric (docs/operating.md's table)", where, m)
		}
		out = append(out, name)
	}
	return out
}

// Dashboard is the part of Grafana's dashboard JSON the tests read.
type Dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name     string `json:"name"`
			Type     string `json:"type"`
			Query    any    `json:"query"`
			AllValue string `json:"allValue"`
			Multi    bool   `json:"multi"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int            `json:"id"`
		Type       string         `json:"type"`
		Title      string         `json:"title"`
		Datasource map[string]any `json:"datasource"`
		GridPos    map[string]int `json:"gridPos"`
		Targets    []struct {
			RefID      string         `json:"refId"`
			Expr       string         `json:"expr"`
			Datasource map[string]any `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
}

// TestDashboardImportable: the dashboard is Grafana JSON that imports as
// is (a Prometheus datasource variable every panel uses, no __inputs to
// fill), with instance and zone variables every query filters on, unique
// panel ids and places, and every metric of the docs' table on a panel.
func TestDashboardImportable(t *testing.T) {
	raw, err := os.ReadFile("sluice-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d Dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("sluice-dashboard.json: %v", err)
	}
	if strings.Contains(string(raw), "__inputs") {
		t.Error("sluice-dashboard.json has __inputs: provisioning would not fill them; use the DS_PROMETHEUS variable")
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: want both", d.UID, d.Title)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "datasource" && v.Query != "prometheus" {
			t.Errorf("variable %s: a datasource variable of %v, want prometheus", v.Name, v.Query)
		}
		if v.Type == "query" && (!v.Multi || v.AllValue != ".*") {
			t.Errorf("variable %s: multi %v, allValue %q; want a multi-value variable whose All is .*", v.Name, v.Multi, v.AllValue)
		}
	}
	if vars["DS_PROMETHEUS"] != "datasource" || vars["zone"] != "query" || vars["instance"] != "query" {
		t.Fatalf("variables %v: want DS_PROMETHEUS (datasource), instance and zone (query)", vars)
	}
	table := metricsTable(t)
	shown := map[string]bool{}
	ids, places := map[int]bool{}, map[[2]int]bool{}
	n := 0
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		place := [2]int{p.GridPos["x"], p.GridPos["y"]}
		if places[place] {
			t.Errorf("panel %q: a second panel at x,y %v", p.Title, place)
		}
		places[place] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 || p.Datasource["uid"] != "${DS_PROMETHEUS}" {
			t.Errorf("panel %q: %d targets, datasource %v; want targets on ${DS_PROMETHEUS}", p.Title, len(p.Targets), p.Datasource)
		}
		for _, tg := range p.Targets {
			n++
			where := "panel " + p.Title + " " + tg.RefID
			if tg.Datasource["uid"] != "${DS_PROMETHEUS}" {
				t.Errorf("%s: datasource %v", where, tg.Datasource)
			}
			if !strings.Contains(tg.Expr, `instance=~"$instance"`) {
				t.Errorf("%s: the query does not filter on $instance: %s", where, tg.Expr)
			}
			for _, m := range metricsIn(t, table, where, tg.Expr) {
				shown[m] = true
				if strings.Contains(table[m].labels, "`zone`") && !strings.Contains(tg.Expr, `zone=~"$zone"`) {
					t.Errorf("%s: %s has a zone label, the query does not filter on $zone", where, m)
				}
			}
		}
	}
	for m := range table {
		if !shown[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
	t.Logf("%d panels, %d queries, %d metrics shown", len(d.Panels), n, len(shown))
}

// TestAlertRulesKnownMetrics: every metric an alert reads is one Sluice
// exports.
func TestAlertRulesKnownMetrics(t *testing.T) {
	table := metricsTable(t)
	for _, r := range readRules(t) {
		if len(metricsIn(t, table, "alert "+r.Alert, r.Expr)) == 0 {
			t.Errorf("alert %s reads no Sluice metric", r.Alert)
		}
	}
}
