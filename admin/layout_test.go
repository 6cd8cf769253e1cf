package admin

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLayoutValues: the admin API and the live page read the zones the
// handlers register as values: of this module the package imports only
// the leaves those values are made of (never the root package, a handler
// or a store module).
func TestLayoutValues(t *testing.T) {
	allowed := map[string]bool{"algorithms": true, "identity": true, "reply": true, "stores": true, "zonemodel": true}
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatal(files, err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			rest, ours := strings.CutPrefix(p, "github.com/sluicehq/caddy-sluice")
			if ours && !allowed[strings.TrimPrefix(rest, "/")] {
				t.Errorf("%s imports %s: package admin takes values (admin.Zone), not the root's or a store's types", name, p)
			}
		}
	}
}
