package caddytest_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// promQuery is one query of the dashboard (a panel's target) or an alert's
// expression.
type promQuery struct {
	name, expr string
}

// dashboardVariables reads the dashboard's query variables: name →
// Grafana's label_values(<selector>, <label>) split into selector and
// label.
func dashboardVariables(t *testing.T) map[string][2]string {
	t.Helper()
	raw, err := os.ReadFile("../observability/sluice-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^label_values\((.+), (\w+)\)$`)
	out := map[string][2]string{}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := re.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Fatalf("variable %s: %q is not label_values(<selector>, <label>)", v.Name, v.Definition)
		}
		out[v.Name] = [2]string{m[1], m[2]}
	}
	return out
}

// dashboardQueries reads every panel target of observability's dashboard,
// its variables substituted as Grafana would for the given instance and
// zones (a multi-value variable becomes a regex alternation) and
// $__rate_interval as rate.
func dashboardQueries(t *testing.T, instance string, zones []string, rate string) []promQuery {
	t.Helper()
	raw, err := os.ReadFile("../observability/sluice-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	r := strings.NewReplacer("$__rate_interval", rate, "$instance", strings.ReplaceAll(regexp.QuoteMeta(instance), `\`, `\\`), "$zone", "("+strings.Join(zones, "|")+")")
	var out []promQuery
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, promQuery{name: p.Title + " " + tg.RefID, expr: r.Replace(tg.Expr)})
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d dashboard queries read", len(out))
	}
	if v := regexp.MustCompile(`\$\w+`).FindString(strings.Join(exprs(out), "\n")); v != "" {
		t.Fatalf("a dashboard query keeps the variable %s after substitution", v)
	}
	return out
}

func exprs(qs []promQuery) []string {
	var s []string
	for _, q := range qs {
		s = append(s, q.expr)
	}
	return s
}

// alertRules reads observability's alert rules by name and writes the
// test copy Prometheus loads: the same rules, every `for:` 0s, so an alert
// fires at its first evaluation where the expression holds.
func alertRules(t *testing.T, dir string) (map[string]string, string) {
	t.Helper()
	raw, err := os.ReadFile("../observability/sluice-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				m[r.Alert] = r.Expr
			}
		}
	}
	noFor := regexp.MustCompile(`(?m)^(\s+for:) \S+$`).ReplaceAll(raw, []byte("$1 0s"))
	path := filepath.Join(dir, "sluice-alerts.yml")
	if err := os.WriteFile(path, noFor, 0o644); err != nil {
		t.Fatal(err)
	}
	return m, path
}
