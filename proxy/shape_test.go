package proxy

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The proxy is the HTTP pipeline only (docs/contributing.md, "Layout"): what any other front
// door or an operator's read needs lives in engine, policy or stream. These bounds keep it so:
// a change that needs more puts its logic where it belongs instead.
const (
	maxProxyLines     = 3000 // lines of non-test Go code in this package
	maxGatewayMethods = 20
)

func TestProxyStaysThePipeline(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	lines, methods := 0, 0
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		lines += bytes.Count(src, []byte("\n"))
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || len(fn.Recv.List) != 1 {
				continue
			}
			if star, ok := fn.Recv.List[0].Type.(*ast.StarExpr); ok {
				if id, ok := star.X.(*ast.Ident); ok && id.Name == "Gateway" {
					methods++
				}
			}
		}
	}
	if lines > maxProxyLines {
		t.Errorf("proxy has %d lines of non-test code, bound %d: move what is not the HTTP pipeline to the package it belongs to", lines, maxProxyLines)
	}
	if methods > maxGatewayMethods {
		t.Errorf("*Gateway has %d methods, bound %d", methods, maxGatewayMethods)
	}
	t.Logf("proxy: %d lines, *Gateway: %d methods", lines, methods)
}
