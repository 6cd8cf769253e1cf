package usage

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLayoutLeaf: the package takes bytes and values: of this module it
// imports algorithms alone (never the root package, a zone or a store).
func TestLayoutLeaf(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatal(files, err)
	}
	const module = "github.com/sluicehq/caddy-sluice"
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
			if strings.HasPrefix(p, module) && p != module+"/algorithms" {
				t.Errorf("%s imports %s: the usage scanners import only algorithms of this module", name, p)
			}
		}
	}
}
