package sluice

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

var update = flag.Bool("update", false, "rewrite the adapt golden files")

// adapt runs the Caddyfile adapter on a whole Caddyfile.
func adapt(t *testing.T, caddyfile string) ([]byte, error) {
	t.Helper()
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	return out, err
}

// TestAdaptGolden adapts every testdata/adapt/*.caddyfile and compares the
// JSON with the .json file beside it (go test -run TestAdaptGolden -update
// rewrites them; review the diff).
func TestAdaptGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/adapt/*.caddyfile")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden inputs: %v", err)
	}
	for _, in := range files {
		name := strings.TrimSuffix(filepath.Base(in), ".caddyfile")
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			got, err := adapt(t, string(src))
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			var pretty bytes.Buffer
			if err := json.Indent(&pretty, got, "", "\t"); err != nil {
				t.Fatal(err)
			}
			pretty.WriteByte('\n')
			golden := strings.TrimSuffix(in, ".caddyfile") + ".json"
			if *update {
				if err := os.WriteFile(golden, pretty.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(pretty.Bytes(), want) {
				t.Errorf("adapted JSON differs from %s:\n--- got\n%s\n--- want\n%s", golden, pretty.String(), want)
			}
		})
	}
}

// TestParseErrors checks that each input the grammar cannot turn into
// fields is refused at adapt time, with a message naming the zone (where
// there is one, quoted) and the field. The values' rules are checked at
// load (TestLoadChecks).
func TestParseErrors(t *testing.T) {
	site := func(block string) string {
		return ":8080 {\n\trate_limit {\n" + block + "\n\t}\n\trespond ok\n}\n"
	}
	zone := func(body string) string {
		return site("\t\tzone z1 {\n" + body + "\n\t\t}")
	}
	const z1 = "\t\tzone z1 {\n\t\t\tevents 1\n\t\t\twindow 1s\n\t\t}\n"
	cases := []struct {
		name, caddyfile string
		want            []string
	}{
		{"zone without name", site("\t\tzone {\n\t\t\tevents 1\n\t\t}"), []string{"zone needs a name"}},
		{"zero events", zone("\t\t\tevents 0\n\t\t\twindow 1m"), []string{`zone "z1"`, "events must be at least 1"}},
		{"negative events", zone("\t\t\tevents -3\n\t\t\twindow 1m"), []string{`zone "z1"`, "events must be at least 1"}},
		{"events not a number", zone("\t\t\tevents many\n\t\t\twindow 1m"), []string{`zone "z1"`, "events must be an integer"}},
		{"zero window", zone("\t\t\tevents 5\n\t\t\twindow 0s"), []string{`zone "z1"`, "window must be positive"}},
		{"negative window", zone("\t\t\tevents 5\n\t\t\twindow -1m"), []string{`zone "z1"`, "window must be positive"}},
		{"bad window", zone("\t\t\tevents 5\n\t\t\twindow soon"), []string{`zone "z1"`, "window: invalid duration"}},
		{"events past 2^53", zone("\t\t\tevents 9007199254740993\n\t\t\twindow 1m"), []string{`zone "z1"`, "events must be at most 2^53"}},
		{"zero burst", zone("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\tburst 0"), []string{`zone "z1"`, "burst must be at least 1"}},
		{"duplicate events", zone("\t\t\tevents 5\n\t\t\tevents 6\n\t\t\twindow 1m"), []string{`zone "z1"`, "duplicate events"}},
		{"duplicate window", zone("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\twindow 2m"), []string{`zone "z1"`, "duplicate window"}},
		{"duplicate key", zone("\t\t\tkey {client_ip}\n\t\t\tkey {remote_host}\n\t\t\tevents 5\n\t\t\twindow 1m"), []string{`zone "z1"`, "duplicate key"}},
		{"empty key", zone("\t\t\tkey\n\t\t\tevents 5\n\t\t\twindow 1m"), []string{`zone "z1"`, "key needs at least one candidate"}},
		{"unknown zone field", zone("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\tlimit 3"), []string{`zone "z1"`, `unknown subdirective "limit"`}},
		{"prefix not a number", zone("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\tipv4_prefix /24"), []string{`zone "z1"`, "ipv4_prefix must be an integer"}},
		{"duplicate cost", zone("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\tcost 1\n\t\t\tcost 2"), []string{`zone "z1"`, "duplicate cost"}},
		{"cost without value", zone("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\tcost"), []string{`zone "z1"`, "cost needs a value"}},
		{"fail without value", zone("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\tfail"), []string{`zone "z1"`, "fail needs a value"}},
		{"match with argument", zone("\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\tmatch /login"), []string{`zone "z1"`, "match takes a block"}},
		{"zone name then argument", site("\t\tzone \"my zone\" extra {\n\t\t\tevents 1\n\t\t}"), []string{`zone "my zone"`, `unexpected argument "extra"`}},
		{"unknown subdirective", site(z1 + "\t\tlimits 5"), []string{`unknown subdirective "limits"`}},
		{"distributed", site(z1 + "\t\tdistributed"), []string{"distributed", "store redis"}},
		{"storage", site(z1 + "\t\tstorage file_system /tmp"), []string{"storage", "store redis"}},
		{"duplicate jitter", site(z1 + "\t\tjitter 0.1\n\t\tjitter 0.2"), []string{"duplicate jitter"}},
		{"duplicate headers", site(z1 + "\t\theaders draft\n\t\theaders both"), []string{"duplicate headers"}},
		{"flag with argument", site(z1 + "\t\tlog_key yes"), []string{"log_key takes no argument"}},
		{"bad enabled", site(z1 + "\t\tenabled maybe"), []string{"enabled must be true or false"}},
		{"zero sweep_interval", site(z1 + "\t\tsweep_interval 0s"), []string{"sweep_interval must be a positive duration"}},
		{"unknown store", site(z1 + "\t\tstore etcd"), []string{"store etcd"}},
		{"bad store option", site(z1 + "\t\tstore memory {\n\t\t\tmax_keys 0\n\t\t}"), []string{"store memory", "max_keys"}},
		{"response status 0", site(z1 + "\t\tresponse {\n\t\t\tstatus 0\n\t\t}"), []string{"response", "status must be a positive integer"}},
		{"unknown response option", site(z1 + "\t\tresponse {\n\t\t\tcolour red\n\t\t}"), []string{"response", `"colour"`}},
		{"response mode", site(z1 + "\t\tresponse problem_json"), []string{"response", "problem_json"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := adapt(t, c.caddyfile)
			if err == nil {
				t.Fatalf("adapted without error:\n%s", c.caddyfile)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestSameZoneSameLimitLoads: one zone name in two sites with one limit is
// allowed (it is one shared bucket).
func TestSameZoneSameLimitLoads(t *testing.T) {
	cf := ":8080 {\n\trate_limit {\n\t\tzone shared {\n\t\t\tevents 5\n\t\t\twindow 1m\n\t\t}\n\t}\n\trespond ok\n}\n:8081 {\n\trate_limit {\n\t\tzone shared {\n\t\t\tevents 5\n\t\t\twindow 60s\n\t\t}\n\t}\n\trespond ok\n}\n"
	if err := validateCaddyfile(t, cf); err != nil {
		t.Fatalf("load: %v", err)
	}
}
