package simulate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "rate-limit",
		Short: "Sluice rate limit tools (simulate)",
		Long: `Tools of the Sluice rate_limit plugin.

  caddy rate-limit simulate --config <file> --traffic <file|pattern>

replays traffic through every rate_limit zone of a config. See
"caddy rate-limit simulate --help".`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.AddCommand(simulateCommand())
		},
	})
}

func simulateCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "simulate --config <file> --traffic <access log|csv|pattern> [--adapter <name>] [--format table|json] [--html <file>] [--compare --zone <zone>]",
		Short: "Replay traffic through a config's rate_limit zones on a virtual clock",
		Long: `Replays traffic through every rate_limit zone of a Caddy config, with the
production code on a virtual clock (memory store semantics; no Redis, no
network, nothing listens), and reports per zone the requests decided,
allowed, refused (and would-refuse for report_only), the keys refused most
(tokens), the peak refusal rate and the Retry-After distribution.

The config is loaded in this process with its real routes, matchers, vars
and map handlers; reverse_proxy, file_server and forward_auth are replaced
by static answers, authentication by the traffic's user id, and every
rate_limit store by the simulator's (see docs/simulate.md).

--traffic is Caddy's JSON access log (gzip too), a CSV of time,key,path,cost,
"-" for standard input, or a built-in pattern:

` + patternHelp,
		Args: cobra.NoArgs,
		RunE: runSimulate,
	}
	f := c.Flags()
	f.StringP("config", "c", "", "Configuration file (Caddyfile or JSON)")
	f.StringP("adapter", "a", "", "Name of config adapter to apply")
	f.StringP("traffic", "t", "", "Traffic: an access log, a CSV, - (standard input) or a pattern")
	f.String("format", "table", "Output: table or json")
	f.String("html", "", "Also write a self-contained HTML report to this file")
	f.Bool("compare", false, "Run the traffic through each algorithm for --zone, side by side")
	f.String("zone", "", "The zone of --compare (and of a pattern's defaults)")
	f.String("server", "", "The http server (apps.http.servers name) for every request; default: by the request's port")
	f.String("host", "", "Host of every request (replacing an access log's); default: a CSV row's or a log line's own, else the first host a site matches")
	f.Int("top", 10, "How many keys refused most to list per zone")
	f.String("overrides", "", "A JSON file of keys' overrides in force during the replay (docs/simulate.md, Overrides)")
	f.Int64("max-keys", defaultMaxKeys, "Stop the replay when the keys held (the sum of the zones' keys) pass this; 0 for no bound")
	return c
}

func runSimulate(cmd *cobra.Command, _ []string) error {
	f := cmd.Flags()
	cfgFile, _ := f.GetString("config")
	adapter, _ := f.GetString("adapter")
	traffic, _ := f.GetString("traffic")
	format, _ := f.GetString("format")
	html, _ := f.GetString("html")
	compare, _ := f.GetBool("compare")
	zone, _ := f.GetString("zone")
	server, _ := f.GetString("server")
	host, _ := f.GetString("host")
	top, _ := f.GetInt("top")
	ovFile, _ := f.GetString("overrides")
	var ovs []KeyOverride
	if ovFile != "" {
		var err error
		if ovs, err = LoadKeyOverrides(ovFile); err != nil {
			return err
		}
	}
	maxKeys, _ := f.GetInt64("max-keys")
	if maxKeys < 0 {
		return fmt.Errorf("--max-keys %d: 0 (no bound) or more", maxKeys)
	}
	if traffic == "" {
		return errors.New("--traffic is required: an access log, a CSV, - or a pattern (" + strings.Join(patternNames, ", ") + ")")
	}
	if format != "table" && format != "json" {
		return fmt.Errorf("--format %q: table or json", format)
	}
	cfg, name, _, err := caddycmd.LoadConfig(cfgFile, adapter)
	if err != nil {
		return err
	}
	if len(cfg) == 0 {
		return errors.New("no config: give --config <file> (or run where a Caddyfile is)")
	}
	if name == "" {
		name = cfgFile
	}
	// The replay allocates per request and keeps little: collect less
	// often (memory stays bounded by the keys).
	debug.SetGCPercent(400)
	rep, err := Run(Options{
		Config: cfg, ConfigName: filepath.Base(name), Traffic: traffic, Zone: zone, Compare: compare,
		Server: server, Host: host, Series: html != "", TopKeys: top, MaxKeys: maxKeys, Progress: os.Stderr,
		KeyOverrides: ovs,
	})
	if err != nil {
		return err
	}
	if err := writeReport(rep, format, html); err != nil {
		return err
	}
	if rep.Stopped != "" {
		return errors.New("the replay stopped early: " + rep.Stopped)
	}
	return nil
}

// defaultMaxKeys bounds the keys a replay holds by default: about 1 GB
// (docs/simulate.md, "Bounds").
const defaultMaxKeys = 2_000_000

// writeReport writes the report as --format and --html say.
func writeReport(rep *Report, format, html string) error {
	if html != "" {
		out, err := os.Create(html)
		if err != nil {
			return err
		}
		if err := rep.WriteHTML(out); err != nil {
			out.Close()
			return err
		}
		if err := out.Close(); err != nil {
			return err
		}
	}
	if format == "json" {
		return rep.WriteJSON(os.Stdout)
	}
	if err := rep.WriteTable(os.Stdout); err != nil {
		return err
	}
	if html != "" {
		fmt.Printf("\nHTML report: %s\n", html)
	}
	return nil
}
