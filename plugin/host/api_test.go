package host_test

import (
	"bytes"
	"go/ast"
	"go/build"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// apiImports are the only packages whose types the exported API of
// plugin/host may name: the standard library's, the ACP SDK's (the
// connection the host owns) and go-plugin's logger. No proto type, and
// nothing of the plugin's own packages, reaches a host.
var apiImports = []string{"context", "io", "time", "github.com/coder/acp-go-sdk", "github.com/hashicorp/go-hclog"}

// exportedAPI returns the exported API of this package as the go tool
// builds it for goos: one line per exported declaration (signatures, and
// the exported fields of exported structs), and the import path of every
// package those lines name.
func exportedAPI(t *testing.T, goos string) (api []string, named map[string]bool) {
	t.Helper()
	ctx := build.Default
	ctx.GOOS, ctx.GOARCH, ctx.CgoEnabled = goos, "amd64", false
	pkg, err := ctx.ImportDir(".", 0)
	if err != nil {
		t.Fatalf("%s: %v", goos, err)
	}
	named = map[string]bool{}
	fset := token.NewFileSet()
	for _, name := range pkg.GoFiles {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		imports := importNames(t, f)
		for _, n := range exportedNodes(f) {
			var b bytes.Buffer
			if err := printer.Fprint(&b, fset, n); err != nil {
				t.Fatal(err)
			}
			api = append(api, strings.Join(strings.Fields(b.String()), " "))
			ast.Inspect(n, func(x ast.Node) bool {
				if sel, ok := x.(*ast.SelectorExpr); ok {
					if id, ok := sel.X.(*ast.Ident); ok {
						named[imports[id.Name]] = true
					}
				}
				return true
			})
		}
	}
	slices.Sort(api)
	return api, named
}

// packageNames caches the package clause of each import path.
var packageNames = map[string]string{}

// importNames maps each import's name in f to its path; an unnamed
// import goes by its package clause.
func importNames(t *testing.T, f *ast.File) map[string]string {
	out := map[string]string{}
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		if im.Name != nil {
			out[im.Name.Name] = p
			continue
		}
		name, ok := packageNames[p]
		if !ok {
			pkg, err := build.Import(p, ".", 0)
			if err != nil {
				t.Fatalf("import %s: %v", p, err)
			}
			name = pkg.Name
			packageNames[p] = name
		}
		out[name] = p
	}
	return out
}

// exportedNodes returns, for f, the nodes that make up the exported API:
// exported functions and methods of exported types without their bodies
// and comments, exported types (structs reduced to their exported
// fields), and exported constants and variables.
func exportedNodes(f *ast.File) []ast.Node {
	var out []ast.Node
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || (d.Recv != nil && !exportedRecv(d.Recv)) {
				continue
			}
			out = append(out, &ast.FuncDecl{Recv: d.Recv, Name: d.Name, Type: d.Type})
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						out = append(out, &ast.GenDecl{Tok: token.TYPE, Specs: []ast.Spec{exportedFields(s)}})
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							out = append(out, &ast.GenDecl{Tok: d.Tok, Specs: []ast.Spec{&ast.ValueSpec{Names: []*ast.Ident{n}, Type: s.Type}}})
						}
					}
				}
			}
		}
	}
	return out
}

func exportedRecv(r *ast.FieldList) bool {
	t := r.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	id, ok := t.(*ast.Ident)
	return ok && id.IsExported()
}

// exportedFields returns s with a struct type reduced to its exported
// (and embedded) fields, which are part of the API; unexported fields are
// not, and differ between systems.
func exportedFields(s *ast.TypeSpec) *ast.TypeSpec {
	st, ok := s.Type.(*ast.StructType)
	if !ok {
		return &ast.TypeSpec{Name: s.Name, Assign: s.Assign, Type: s.Type}
	}
	fields := &ast.FieldList{}
	for _, f := range st.Fields.List {
		if len(f.Names) == 0 || f.Names[0].IsExported() {
			fields.List = append(fields.List, &ast.Field{Names: f.Names, Type: f.Type, Tag: f.Tag})
		}
	}
	return &ast.TypeSpec{Name: s.Name, Type: &ast.StructType{Fields: fields}}
}

// TestExportedAPIIsGoNative: the API a host sees names no proto type (and
// nothing of the plugin's own packages), only Go-native types, and it is
// the same API on Linux and on other systems (where only the sealed copy
// of exe_other.go differs). Exposing a proto type, or an API that differs
// between systems, fails it.
func TestExportedAPIIsGoNative(t *testing.T) {
	linux, named := exportedAPI(t, "linux")
	if len(linux) < 40 {
		t.Fatalf("found only %d exported declarations: %v", len(linux), linux)
	}
	for p := range named {
		if !slices.Contains(apiImports, p) {
			t.Errorf("the exported API names a type from %q; it may name only %v", p, apiImports)
		}
	}
	for _, goos := range []string{"darwin", "windows"} {
		other, _ := exportedAPI(t, goos)
		if !slices.Equal(linux, other) {
			for _, l := range linux {
				if !slices.Contains(other, l) {
					t.Errorf("%s lacks: %s", goos, l)
				}
			}
			for _, o := range other {
				if !slices.Contains(linux, o) {
					t.Errorf("%s has, Linux has not: %s", goos, o)
				}
			}
		}
	}
}

// TestCrossBuild: the package and the plugin binary build for systems
// without the sealed memfd (there Load returns ErrUnimplemented), so a
// host agent that imports the package still builds there.
func TestCrossBuild(t *testing.T) {
	for _, goos := range []string{"darwin", "windows"} {
		cmd := exec.Command("go", "build", "-o", os.DevNull, ".", "../cmd/tether-plugin")
		cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH=amd64", "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("GOOS=%s go build ./plugin/host/ ./plugin/cmd/tether-plugin/: %v\n%s", goos, err, out)
		}
	}
}

// TestOnlyTheMemfdIsLinuxOnly: on darwin and windows the package compiles
// the same files as on Linux except the sealed copy (exe_linux.go becomes
// exe_other.go), so everything but starting the plugin is the same code
// everywhere. A new Linux-only file fails it.
func TestOnlyTheMemfdIsLinuxOnly(t *testing.T) {
	files := func(goos string) []string {
		cmd := exec.Command("go", "list", "-f", "{{join .GoFiles \" \"}}", ".")
		cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH=amd64", "CGO_ENABLED=0")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("GOOS=%s go list: %v", goos, err)
		}
		return strings.Fields(string(out))
	}
	linux := files("linux")
	if !slices.Contains(linux, "exe_linux.go") || len(linux) < 5 {
		t.Fatalf("linux files: %v", linux)
	}
	for _, goos := range []string{"darwin", "windows"} {
		want := slices.Clone(linux)
		want[slices.Index(want, "exe_linux.go")] = "exe_other.go"
		slices.Sort(want)
		if got := files(goos); !slices.Equal(got, want) {
			t.Errorf("GOOS=%s compiles %v, want %v", goos, got, want)
		}
	}
}
