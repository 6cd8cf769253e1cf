package sluice

// The tests of this file keep the manual (README.md and docs/*.md) true:
//
//   - TestDocsCaddySnippets: every ```caddy snippet is adapted and validated
//     by Caddy (as `caddy validate` does), a bare directive wrapped into a
//     site and a bare global options block given a site; a snippet shown
//     as a file's content is that file's content. A snippet that cannot
//     run alone is marked `<!-- snippet: fragment (why) -->` and counted.
//   - TestDocsReferenceCoversParsers: every subdirective the Caddyfile
//     parsers accept (collected from their source with go/ast) has a row in
//     its level's table of docs/reference.md and appears in its grammar
//     block, every JSON field (from the structs' tags) is in the JSON column
//     of that table, and each parser's "(known: ...)" error list names
//     every subdirective it accepts.
//   - TestDocsJSONSkeletons: the JSON of docs/reference.md loads into the
//     handler and its store with unknown fields refused, is valid as a
//     whole config, and together names every JSON field.
//   - TestDocsMetricsTable: every collector the code registers is in
//     docs/operating.md's metrics table, with its type and labels.
//   - TestDocsPlaceholders: docs/reference.md's placeholders table lists
//     exactly the placeholders the code names (reply/placeholders.go).
//   - TestDocsLinks, TestDocsReadme: relative links and anchors resolve;
//     the README keeps its two commands and its length.
//
// The behaviour the pages describe (the tutorials, weighted costs, the off
// switch, handle_errors) is exercised against a running Caddy in
// caddytest/docs_test.go.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/memstore"
	"github.com/sluicehq/caddy-sluice/redisstore"
	"github.com/sluicehq/caddy-sluice/reply"
)

// docFiles are the pages of the manual.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("docs/*.md")
	if err != nil || len(files) < 7 {
		t.Fatalf("docs/*.md: %v (%d files)", err, len(files))
	}
	return append([]string{"README.md"}, files...)
}

// snippet is one fenced code block of a page.
type snippet struct {
	file, lang, text string
	line             int    // the fence's line
	kind, arg        string // from a `<!-- snippet: kind arg -->` line right before it
}

func (s snippet) where() string { return s.file + ":" + strconv.Itoa(s.line) }

var markerRe = regexp.MustCompile(`^<!-- snippet: (\S+)\s*(.*?)\s*-->$`)

// snippets returns the fenced code blocks of a Markdown file.
func snippets(t *testing.T, file string) []snippet {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	var out []snippet
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "```") {
			continue
		}
		indent := lines[i][:strings.Index(lines[i], "```")]
		s := snippet{file: file, lang: strings.TrimPrefix(l, "```"), line: i + 1}
		for j := i - 1; j >= 0; j-- {
			if p := strings.TrimSpace(lines[j]); p != "" {
				if m := markerRe.FindStringSubmatch(p); m != nil {
					s.kind, s.arg = m[1], m[2]
				}
				break
			}
		}
		var body []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body = append(body, strings.TrimPrefix(lines[i], indent))
		}
		if i == len(lines) {
			t.Fatalf("%s: the fence is not closed", s.where())
		}
		s.text = strings.Join(body, "\n") + "\n"
		out = append(out, s)
	}
	return out
}

// siteAddress matches the first line of a site block.
var siteAddress = regexp.MustCompile(`^(https?://\S+|:\S+|[a-z0-9-]+(\.[a-z0-9-]+)+(:\d+)?|localhost(:\d+)?)(\s*,\s*\S+)*\s*\{$`)

// wholeCaddyfile turns a snippet into a Caddyfile Caddy can load: a site or
// a Caddyfile as it is, a global options block alone followed by a site
// that uses a zone (so that a global store is provisioned), anything else
// (a directive, several) wrapped into a site.
func wholeCaddyfile(text string) (string, string) {
	first := ""
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			first = l
			break
		}
	}
	const site = ":0 {\n\trate_limit {\n\t\tzone docs_snippet_site {\n\t\t\tevents 1\n\t\t\twindow 1m\n\t\t}\n\t}\n\trespond ok\n}\n"
	switch {
	case first == "{":
		if globalOnly(text) {
			return text + "\n" + site, "global options, with a site"
		}
		return text, "Caddyfile"
	case siteAddress.MatchString(first):
		return text, "site"
	}
	return ":0 {\n" + text + "\n}\n", "directives, in a site"
}

var (
	redisURLRe     = regexp.MustCompile(`rediss?(\+sentinel)?://[^\s"{}]+`)
	redisClusterRe = regexp.MustCompile(`(?m)^(\s*cluster)( +[^\s{}]+)+$`)
	jsonClusterRe  = regexp.MustCompile(`"cluster": *\[[^\]]*\]`)
	// jsonTLSFilesRe: a store's TLS files, which exist only where the example runs.
	jsonTLSFilesRe = regexp.MustCompile(`"tls_(ca|cert|key)": "[^"]*",\s*`)
)

// noRedisAddrs points the Redis addresses of a snippet at a port that
// refuses connections, so that validating it never touches a Redis that
// happens to run there (provisioning the store loads its code into Redis).
func noRedisAddrs(text string) string {
	text = redisURLRe.ReplaceAllString(text, "redis://127.0.0.1:1")
	text = redisClusterRe.ReplaceAllString(text, "${1} 127.0.0.1:1")
	text = jsonTLSFilesRe.ReplaceAllString(text, "")
	return jsonClusterRe.ReplaceAllString(text, `"cluster": ["127.0.0.1:1"]`)
}

// globalOnly reports whether text is one global options block and nothing
// else.
func globalOnly(text string) bool {
	depth, closed := 0, false
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if closed {
			return false
		}
		depth += strings.Count(l, "{") - strings.Count(l, "}")
		if depth == 0 {
			closed = true
		}
	}
	return closed
}

func TestDocsCaddySnippets(t *testing.T) {
	// Placeholders the snippets use, resolved when a store is provisioned:
	// a Redis that refuses connections at once (an unreachable Redis at
	// load is a warning).
	t.Setenv("REDIS_URL", "redis://127.0.0.1:1")
	t.Setenv("REDIS_PASSWORD", "docs")
	var checked, files, grammar int
	skipped := map[string]string{}
	for _, f := range docFiles(t) {
		for _, s := range snippets(t, f) {
			if s.lang != "caddy" {
				continue
			}
			switch s.kind {
			case "fragment":
				if s.arg == "" {
					t.Errorf("%s: a fragment must say why it cannot run alone: <!-- snippet: fragment (why) -->", s.where())
				}
				skipped[s.where()] = s.arg
				continue
			case "grammar":
				grammar++ // checked by TestDocsReferenceCoversParsers
				continue
			case "file":
				want, err := os.ReadFile(s.arg)
				if err != nil {
					t.Errorf("%s: %v", s.where(), err)
					continue
				}
				if s.text != string(want) {
					t.Errorf("%s: the snippet is not the content of %s", s.where(), s.arg)
				}
				files++
			case "", "id":
			default:
				t.Errorf("%s: unknown snippet marker %q", s.where(), s.kind)
				continue
			}
			cfg, how := wholeCaddyfile(noRedisAddrs(s.text))
			if err := validateCaddyfile(t, cfg); err != nil {
				t.Errorf("%s (%s): %v\n%s", s.where(), how, err, cfg)
				continue
			}
			checked++
		}
	}
	// The tutorials' Caddyfiles, whether or not a page shows them.
	tutorials, _ := filepath.Glob("docs/tutorial/*.Caddyfile")
	for _, f := range tutorials {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := validateCaddyfile(t, string(raw)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	if len(tutorials) < 2 {
		t.Errorf("docs/tutorial/*.Caddyfile: %d files, want the two tutorials", len(tutorials))
	}
	t.Logf("caddy snippets: %d adapted and validated (%d of them the content of a file), %d grammar blocks (checked for completeness), %d skipped:", checked, files, grammar, len(skipped))
	for where, why := range skipped {
		t.Logf("  skipped %s: %s", where, why)
	}
	if checked < 15 || len(skipped) >= checked {
		t.Errorf("only %d snippets validated (%d skipped): the test lost its snippets", checked, len(skipped))
	}
}

// TestDocsOneLineBlockDoesNotParse keeps docs/reference.md's warning true:
// a Caddyfile has no ';', and a block's settings cannot share its first line.
func TestDocsOneLineBlockDoesNotParse(t *testing.T) {
	for _, block := range []string{
		"\t\tstore redis redis://127.0.0.1:1 {\n\t\t\tbreaker { failures 5 }\n\t\t}",
		"\t\tstore redis redis://127.0.0.1:1 {\n\t\t\tbreaker {\n\t\t\t\tfailures 5; cooldown 1s\n\t\t\t}\n\t\t}",
		"\t\tstore memory { max_keys 10 }",
	} {
		if _, err := adapt(t, site("", zoneZ+block)); err == nil {
			t.Errorf("adapted:\n%s", block)
		}
	}
}

// refusedNames are caddy-ratelimit's settings that Sluice parses only to
// refuse them with the Sluice equivalent: not in the "known" lists nor the
// grammar (docs/reference.md lists them in the directive's table).
var refusedNames = []string{"distributed", "storage"}

// parserNames are the subdirectives one parser function accepts.
type parserNames struct {
	section string   // the docs/reference.md section documenting them
	cases   []string // case labels of its switch on the subdirective's name
	compare []string // keywords compared with d.Val() (response handle_errors)
}

// collectParserNames reads the Caddyfile parsers' source: in each function,
// the string case labels of every switch on the subdirective's name (a
// switch on `field` or on d.Val()) and the string literals compared with
// d.Val(). It also checks each such switch's "(known: ...)" error list.
func collectParserNames(t *testing.T) []parserNames {
	t.Helper()
	funcs := []struct{ file, fn, section string }{
		{"caddyfile.go", "UnmarshalCaddyfile", "Directive"},
		{"caddyfile.go", "parseGlobalOption", "Global option"},
		{"zonemodel/caddyfile.go", "ParseZone", "Zone"},
		{"reply/caddyfile.go", "ParseResponse", "Response"},
		{"memstore/module.go", "UnmarshalCaddyfile", "Store memory"},
		{"redisstore/module.go", "UnmarshalCaddyfile", "Store redis"},
		{"redisstore/module.go", "unmarshalBreaker", "Breaker"},
	}
	refused := refusedNames
	fset := token.NewFileSet()
	parsed := map[string]*ast.File{}
	var out []parserNames
	for _, fn := range funcs {
		f := parsed[fn.file]
		if f == nil {
			var err error
			if f, err = parser.ParseFile(fset, fn.file, nil, 0); err != nil {
				t.Fatal(err)
			}
			parsed[fn.file] = f
		}
		var decl *ast.FuncDecl
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == fn.fn {
				decl = fd
			}
		}
		if decl == nil {
			t.Fatalf("%s: no function %s (update this test's list)", fn.file, fn.fn)
		}
		p := parserNames{section: fn.section}
		ast.Inspect(decl.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SwitchStmt:
				if !isNameTag(n.Tag) {
					return true
				}
				var labels []string
				var known []string
				for _, st := range n.Body.List {
					cc := st.(*ast.CaseClause)
					if cc.List == nil {
						known = knownList(cc)
						continue
					}
					for _, e := range cc.List {
						if s, ok := stringLit(e); ok {
							labels = append(labels, s)
						}
					}
				}
				p.cases = append(p.cases, labels...)
				if known == nil {
					t.Errorf("%s %s: the switch on the subdirective's name has no \"(known: ...)\" error", fn.file, fn.fn)
				}
				for _, l := range labels {
					if !slices.Contains(known, l) && !slices.Contains(refused, l) {
						t.Errorf("%s %s: %q is accepted but missing from the error's known list %v", fn.file, fn.fn, l, known)
					}
				}
				for _, k := range known {
					if !slices.Contains(labels, k) {
						t.Errorf("%s %s: the known list names %q, which is not accepted", fn.file, fn.fn, k)
					}
				}
			case *ast.BinaryExpr:
				if (n.Op == token.EQL || n.Op == token.NEQ) && isNameTag(n.X) {
					if s, ok := stringLit(n.Y); ok {
						p.compare = append(p.compare, s)
					}
				}
			}
			return true
		})
		if len(p.cases) == 0 {
			t.Fatalf("%s %s: no subdirective found", fn.file, fn.fn)
		}
		out = append(out, p)
	}
	return out
}

// isNameTag reports an expression that holds a subdirective's name: the
// variable `field` or a call d.Val().
func isNameTag(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name == "field"
	case *ast.CallExpr:
		sel, ok := e.Fun.(*ast.SelectorExpr)
		return ok && sel.Sel.Name == "Val" && len(e.Args) == 0
	}
	return false
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

var knownRe = regexp.MustCompile(`\(known: ([^)]*)\)`)

// knownList returns the names of a default clause's "(known: a, b)" text.
func knownList(cc *ast.CaseClause) []string {
	var out []string
	ast.Inspect(cc, func(n ast.Node) bool {
		if s, ok := stringLit(asExpr(n)); ok {
			if m := knownRe.FindStringSubmatch(s); m != nil {
				for _, k := range strings.Split(m[1], ",") {
					out = append(out, strings.TrimSpace(k))
				}
			}
		}
		return true
	})
	return out
}

func asExpr(n ast.Node) ast.Expr {
	e, _ := n.(ast.Expr)
	return e
}

// refSection is one "## " section of docs/reference.md: its table rows'
// cells.
type refSection struct {
	rows [][]string
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

// referenceSections splits docs/reference.md into its "## " sections and
// their table rows, and returns the grammar block.
func referenceSections(t *testing.T) (map[string]*refSection, string) {
	t.Helper()
	raw, err := os.ReadFile("docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	secs := map[string]*refSection{}
	var cur *refSection
	for _, l := range strings.Split(string(raw), "\n") {
		if h, ok := strings.CutPrefix(l, "## "); ok {
			cur = &refSection{}
			secs[h] = cur
			continue
		}
		if cur == nil || !strings.HasPrefix(l, "|") || strings.HasPrefix(l, "|---") {
			continue
		}
		// Cells, with escaped pipes (`a\|b`) kept inside their cell.
		cells := strings.Split(strings.ReplaceAll(strings.Trim(l, "|"), `\|`, "\x00"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(strings.ReplaceAll(cells[i], "\x00", "|"))
		}
		cur.rows = append(cur.rows, cells)
	}
	var grammar string
	for _, s := range snippets(t, "docs/reference.md") {
		if s.kind == "grammar" {
			grammar += s.text
		}
	}
	if grammar == "" {
		t.Fatal("docs/reference.md has no grammar block (<!-- snippet: grammar -->)")
	}
	return secs, grammar
}

// spans returns the code spans of a cell.
func spans(cell string) []string {
	var out []string
	for _, m := range codeSpan.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}

func wordIn(word, text string) bool {
	return regexp.MustCompile(`(^|[^a-z_])` + regexp.QuoteMeta(word) + `($|[^a-z_])`).MatchString(text)
}

func TestDocsReferenceCoversParsers(t *testing.T) {
	secs, grammar := referenceSections(t)
	section := func(name string) *refSection {
		s := secs[name]
		if s == nil || len(s.rows) < 2 {
			t.Fatalf("docs/reference.md has no table in a section %q", name)
		}
		return s
	}
	names := 0
	for _, p := range collectParserNames(t) {
		sec := section(p.section)
		for _, name := range p.cases {
			names++
			found := false
			for _, row := range sec.rows[1:] {
				for _, sp := range spans(row[0]) {
					if sp == name || strings.HasPrefix(sp, name+" ") {
						found = true
					}
				}
			}
			if !found {
				t.Errorf("docs/reference.md, %q: no row whose Caddyfile column starts with `%s`", p.section, name)
			}
			if !wordIn(name, grammar) && !slices.Contains(refusedNames, name) {
				t.Errorf("docs/reference.md: the grammar block does not mention %s (%s)", name, p.section)
			}
		}
		for _, name := range p.compare {
			names++
			found := false
			for _, row := range sec.rows[1:] {
				for _, sp := range spans(row[0]) {
					found = found || wordIn(name, sp)
				}
			}
			if !found {
				t.Errorf("docs/reference.md, %q: no row shows `%s`", p.section, name)
			}
			if !wordIn(name, grammar) {
				t.Errorf("docs/reference.md: the grammar block does not mention %s (%s)", name, p.section)
			}
		}
	}
	fields := 0
	for _, c := range jsonStructs() {
		sec := section(c.section)
		for _, name := range jsonFields(c.typ) {
			fields++
			found := false
			for _, row := range sec.rows[1:] {
				found = found || len(row) > 1 && slices.Contains(spans(row[1]), name)
			}
			if !found {
				t.Errorf("docs/reference.md, %q: JSON field %q is in no row's JSON column", c.section, name)
			}
		}
	}
	t.Logf("%d Caddyfile subdirectives and %d JSON fields documented", names, fields)
}

// jsonStructs are the configuration structs and their reference sections.
func jsonStructs() []struct {
	section string
	typ     reflect.Type
} {
	return []struct {
		section string
		typ     reflect.Type
	}{
		{"Directive", reflect.TypeFor[Handler]()},
		{"Zone", reflect.TypeFor[Zone]()},
		{"Response", reflect.TypeFor[Response]()},
		{"Store memory", reflect.TypeFor[memstore.Memory]()},
		{"Store redis", reflect.TypeFor[redisstore.Redis]()},
		{"Breaker", reflect.TypeFor[redisstore.Breaker]()},
	}
}

// jsonFields returns the JSON names of a struct's exported fields.
func jsonFields(typ reflect.Type) []string {
	var out []string
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		out = append(out, name)
	}
	return out
}

// strictDecode decodes raw into v, refusing unknown fields.
func strictDecode(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// withoutKey returns an object's JSON without one key, and that key's
// string value.
func withoutKey(raw []byte, key string) ([]byte, string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, "", err
	}
	var v string
	if r, ok := m[key]; ok {
		if err := json.Unmarshal(r, &v); err != nil {
			return nil, "", fmt.Errorf("%s: %v", key, err)
		}
	}
	delete(m, key)
	out, err := json.Marshal(m)
	return out, v, err
}

// seenKeys adds the keys of the objects of raw, by where they are: "" the
// handler, "zone", "response", "store:<module>", "breaker".
func seenKeys(t *testing.T, raw []byte, seen map[string]map[string]bool) {
	t.Helper()
	add := func(where string, obj map[string]json.RawMessage) {
		if seen[where] == nil {
			seen[where] = map[string]bool{}
		}
		for k := range obj {
			seen[where][k] = true
		}
	}
	var h map[string]json.RawMessage
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatal(err)
	}
	add("", h)
	var zones map[string]map[string]json.RawMessage
	_ = json.Unmarshal(h["rate_limits"], &zones)
	for _, z := range zones {
		add("zone", z)
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(h["response"], &obj) == nil {
		add("response", obj)
	}
	var store map[string]json.RawMessage
	if json.Unmarshal(h["store"], &store) == nil {
		var mod string
		_ = json.Unmarshal(store["module"], &mod)
		add("store:"+mod, store)
		if json.Unmarshal(store["breaker"], &obj) == nil {
			add("breaker", obj)
		}
	}
}

func TestDocsJSONSkeletons(t *testing.T) {
	t.Setenv("REDIS_PASSWORD", "docs")
	seen := map[string]map[string]bool{}
	n := 0
	for _, s := range snippets(t, "docs/reference.md") {
		if s.kind != "handler-json" {
			continue
		}
		n++
		if s.lang != "json" {
			t.Fatalf("%s: a handler-json snippet must be ```json", s.where())
		}
		raw := []byte(s.text)
		seenKeys(t, raw, seen)
		body, handler, err := withoutKey(raw, "handler")
		if err != nil || handler != "rate_limit" {
			t.Errorf("%s: \"handler\" is %q (%v), want rate_limit", s.where(), handler, err)
			continue
		}
		var h Handler
		if err := strictDecode(body, &h); err != nil {
			t.Errorf("%s: into Handler: %v", s.where(), err)
			continue
		}
		if h.StoreRaw != nil {
			store, mod, err := withoutKey(h.StoreRaw, "module")
			if err != nil {
				t.Errorf("%s: store: %v", s.where(), err)
				continue
			}
			var into any
			switch mod {
			case "memory":
				into = new(memstore.Memory)
			case "redis":
				into = new(redisstore.Redis)
			default:
				t.Errorf("%s: store module %q", s.where(), mod)
				continue
			}
			if err := strictDecode(store, into); err != nil {
				t.Errorf("%s: into the %s store: %v", s.where(), mod, err)
				continue
			}
		}
		// And the whole handler loads, as `caddy validate` would load it.
		cfg := `{"admin":{"disabled":true},"apps":{"http":{"servers":{"docs":{"listen":[":0"],"routes":[{"handle":[` + noRedisAddrs(s.text) + `]}]}}}}}`
		var c caddy.Config
		if err := json.Unmarshal([]byte(cfg), &c); err != nil {
			t.Fatalf("%s: %v", s.where(), err)
		}
		if err := caddy.Validate(&c); err != nil {
			t.Errorf("%s: does not load: %v", s.where(), err)
		}
	}
	if n == 0 {
		t.Fatal("docs/reference.md has no <!-- snippet: handler-json --> block")
	}
	// Together they name every field (the refused ones excepted).
	refused := refusedNames
	for _, c := range []struct {
		where string
		typ   reflect.Type
	}{
		{"", reflect.TypeFor[Handler]()}, {"zone", reflect.TypeFor[Zone]()}, {"response", reflect.TypeFor[Response]()},
		{"store:memory", reflect.TypeFor[memstore.Memory]()}, {"store:redis", reflect.TypeFor[redisstore.Redis]()},
		{"breaker", reflect.TypeFor[redisstore.Breaker]()},
	} {
		for _, f := range jsonFields(c.typ) {
			if !seen[c.where][f] && !slices.Contains(refused, f) {
				t.Errorf("docs/reference.md: no JSON example has the %s field %q", c.typ.Name(), f)
			}
		}
	}
	t.Logf("%d JSON configs load", n)
}

var linkRe = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinks: every relative link of the manual names a file that
// exists, and every #anchor a heading of its page.
func TestDocsLinks(t *testing.T) {
	anchors := func(file string) map[string]bool {
		raw, err := os.ReadFile(file)
		if err != nil {
			return nil
		}
		out := map[string]bool{}
		for _, l := range strings.Split(string(raw), "\n") {
			if h := strings.TrimLeft(l, "#"); len(h) < len(l) && strings.HasPrefix(h, " ") {
				out[slug(h)] = true
			}
		}
		return out
	}
	for _, f := range append(docFiles(t), "bench/README.md", "bench/RESULTS.md") {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range linkRe.FindAllStringSubmatch(string(raw), -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(link, "#")
			target := f
			if path != "" {
				target = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s: link %s: %v", f, link, err)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(target, ".md") && !anchors(target)[anchor] {
				t.Errorf("%s: link %s: %s has no heading #%s", f, link, target, anchor)
			}
		}
	}
}

// slug is GitHub's anchor for a heading.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		case r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDocsReadme: the README keeps its two commands, stays short, and
// links every page of docs/.
func TestDocsReadme(t *testing.T) {
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	for _, cmd := range []string{"go run ./cmd/caddy run --config Caddyfile.example", "make test"} {
		if !strings.Contains(readme, "\n"+cmd+"\n") {
			t.Errorf("README.md: the command %q is not on a line of its own", cmd)
		}
	}
	if n := strings.Count(readme, "\n"); n > 300 {
		t.Errorf("README.md has %d lines, more than 300: move detail to docs/", n)
	}
	pages, _ := filepath.Glob("docs/*.md")
	for _, p := range pages {
		if !strings.Contains(readme, "]("+filepath.ToSlash(p)+")") {
			t.Errorf("README.md does not link %s", p)
		}
	}
	examples, _ := filepath.Glob("examples/*.Caddyfile")
	for _, e := range examples {
		if !strings.Contains(readme, "]("+filepath.ToSlash(e)+")") {
			t.Errorf("README.md's examples table does not link %s", e)
		}
	}
}

// TestDocsMetricsTable: every Prometheus collector the handler and the
// stores register (read from telemetry/metrics.go, redisstore/metrics.go and
// memstore/module.go) has a row in docs/operating.md's metrics table with
// its type and labels (issue 13, item 20: the circuit and deny cache
// metrics were missing).
func TestDocsMetricsTable(t *testing.T) {
	raw, err := os.ReadFile("docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, l := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(l, "| `caddy_rate_limit_") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows[strings.Trim(cells[0], "`")] = cells
	}
	fset := token.NewFileSet()
	n := 0
	for _, file := range []string{"telemetry/metrics.go", "redisstore/metrics.go", "memstore/module.go"} {
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(node ast.Node) bool {
			call, ok := node.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !strings.HasPrefix(sel.Sel.Name, "New") || len(call.Args) == 0 {
				return true
			}
			kind := ""
			for _, k := range []string{"Counter", "Gauge", "Histogram"} {
				if strings.HasPrefix(sel.Sel.Name, "New"+k) {
					kind = strings.ToLower(k)
				}
			}
			opts, ok := call.Args[0].(*ast.CompositeLit)
			if kind == "" || !ok {
				return true
			}
			var name string
			for _, e := range opts.Elts {
				if kv, ok := e.(*ast.KeyValueExpr); ok && fmt.Sprint(kv.Key) == "Name" {
					name, _ = stringLit(kv.Value)
				}
			}
			var labels []string
			if len(call.Args) > 1 {
				if lit, ok := call.Args[1].(*ast.CompositeLit); ok {
					for _, e := range lit.Elts {
						if s, ok := stringLit(e); ok {
							labels = append(labels, s)
						}
					}
				}
			}
			full := "caddy_rate_limit_" + name
			n++
			row, ok := rows[full]
			if !ok {
				t.Errorf("docs/operating.md: no row for %s (%s)", full, file)
				return true
			}
			if row[1] != kind {
				t.Errorf("docs/operating.md: %s is a %s, the table says %q", full, kind, row[1])
			}
			if got := spans(row[2]); !slices.Equal(got, labels) {
				t.Errorf("docs/operating.md: %s has labels %v, the table says %v", full, labels, got)
			}
			return true
		})
	}
	if n < 8 || len(rows) != n {
		t.Errorf("%d collectors in the source, %d rows in the table", n, len(rows))
	}
}

func TestDocsNoRedisAddrs(t *testing.T) {
	for in, want := range map[string]string{
		"store redis redis://10.0.0.5:6379\n":                       "store redis redis://127.0.0.1:1\n",
		"\tstore redis rediss://u:p@h:6380/2 {\n":                   "\tstore redis redis://127.0.0.1:1 {\n",
		"url redis+sentinel://s:26379/0?master_name=m\n":            "url redis://127.0.0.1:1\n",
		"\t\tcluster 10.0.0.11:6379 10.0.0.12:6379\n":               "\t\tcluster 127.0.0.1:1\n",
		`"url": "redis://127.0.0.1:6379",`:                          `"url": "redis://127.0.0.1:1",`,
		`"cluster": ["10.0.0.11:6379", "10.0.0.12:6379"],`:          `"cluster": ["127.0.0.1:1"],`,
		"store redis {env.REDIS_URL}\n\t\tcluster {$CLUSTER:a:1}\n": "store redis {env.REDIS_URL}\n\t\tcluster {$CLUSTER:a:1}\n",
	} {
		if got := noRedisAddrs(in); got != want {
			t.Errorf("noRedisAddrs(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDocsPlaceholders: the placeholders table of docs/reference.md lists
// the refusal's placeholders (reply/placeholders.go's table, which builds them)
// and the delay's, and nothing else.
func TestDocsPlaceholders(t *testing.T) {
	raw, err := os.ReadFile("docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(raw), "**Placeholders**, set on a refusal")
	if !ok {
		t.Fatal("docs/reference.md: no **Placeholders** table")
	}
	var documented []string
	for _, l := range strings.Split(table, "\n")[1:] {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "|") {
			break // the table's end
		}
		if name, ok := strings.CutPrefix(l, "| `{"); ok {
			documented = append(documented, name[:strings.Index(name, "}")])
		}
	}
	want := reply.PlaceholderNames()
	slices.Sort(documented)
	slices.Sort(want)
	if !slices.Equal(documented, want) {
		t.Errorf("docs/reference.md documents the placeholders\n%v\nthe code names\n%v", documented, want)
	}
}
