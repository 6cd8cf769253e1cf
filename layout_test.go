package sluice

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestLayoutHubNamesNoControl: the admission's hub (admission.go,
// controls.go, statuswriter.go, the ledger reservation.go, the fail policy
// failpolicy.go and ServeHTTP) reaches the controls only
// through their hooks: it reads none of their zone or handler state (the
// admission's own fields are the hooks' per-request state). And each line of the
// controls table names the file that declares that control.
func TestLayoutHubNamesNoControl(t *testing.T) {
	controlState := map[string]bool{"conc": true, "counts": true, "pass": true, "delaying": true, "counting": true,
		"passing": true, "concurrent": true, "settled": true, "inflight": true,
		"settling": true, "requestJSON": true, "count": true, "turn": true,
		"reading": true, "holds": true, "forwarded": true, "paths": true, "strip": true}
	fset := token.NewFileSet()
	parse := func(name string) *ast.File {
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	check := func(where string, n ast.Node) {
		ast.Inspect(n, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && controlState[sel.Sel.Name] {
				t.Errorf("%s: %s reads a control's state (.%s): call it through a hook instead", where, fset.Position(sel.Pos()), sel.Sel.Name)
			}
			return true
		})
	}
	for _, name := range []string{"admission.go", "controls.go", "statuswriter.go", "reservation.go", "failpolicy.go"} {
		check(name, parse(name))
	}
	for _, d := range parse("handler.go").Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "ServeHTTP" {
			check("ServeHTTP", fn)
		}
	}

	// The table's lines: "&countControl, // count.go".
	src, err := os.ReadFile("controls.go")
	if err != nil {
		t.Fatal(err)
	}
	lines := regexp.MustCompile(`(?m)^\t&(\w+Control),\s+// (\S+\.go)$`).FindAllStringSubmatch(string(src), -1)
	if len(lines) != len(controls) {
		t.Fatalf("%d lines in the controls table, want %d (one per control)", len(lines), len(controls))
	}
	for _, l := range lines {
		decl, err := os.ReadFile(l[2])
		if err != nil || !strings.Contains(string(decl), "\nvar "+l[1]+" = control{") {
			t.Errorf("the table says %s is declared in %s: it is not (%v)", l[1], l[2], err)
		}
	}
}

// TestLayoutLeaves: the packages around the root take values, never the
// root package, a handler or a store module: of this module each imports
// only what its row allows (algorithms nothing of ours).
func TestLayoutLeaves(t *testing.T) {
	const module = "github.com/sluicehq/caddy-sluice"
	for dir, allowed := range map[string][]string{
		"algorithms": nil,
		"reply":      {"algorithms"},
		"usage":      {"algorithms"},
		"telemetry":  nil,
		"admin":      {"algorithms", "identity", "reply", "stores", "zonemodel"},
		"zonemodel":  {"adaptive", "algorithms", "identity"},
		"zoneapp":    {"algorithms", "zonemodel"},
	} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for _, e := range entries {
			name := e.Name()
			if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			seen++
			f, err := parser.ParseFile(token.NewFileSet(), dir+"/"+name, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if p != module && !strings.HasPrefix(p, module+"/") {
					continue
				}
				if rest := strings.TrimPrefix(strings.TrimPrefix(p, module), "/"); !slices.Contains(allowed, rest) {
					t.Errorf("%s/%s imports %s: package %s imports only %v of this module", dir, name, p, dir, allowed)
				}
			}
		}
		if seen == 0 {
			t.Errorf("package %s: no Go file read", dir)
		}
	}
}
