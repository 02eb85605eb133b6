package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// maxMethods is the most methods a type of the module may have, its own and
// those promoted from the fields it embeds: a type past that does several
// jobs (safe-restart's one `app` type once had 38).
const maxMethods = 15

// TestNoTypeHasMoreThan15Methods counts, for every named type in the
// non-test files of the packages the three binaries import, the names of
// its methods and of those it gets from the module's types it embeds (by
// value or pointer, from its own package or another of the module's): the
// union of names, an upper bound of its method set. Types embedded from
// other modules are not counted: the rule is about code this module writes.
func TestNoTypeHasMoreThan15Methods(t *testing.T) {
	root := moduleRoot(t)
	modPath := modulePath(t, root)
	type typeInfo struct {
		methods  []string
		embedded []string // "dir.Type" of the module's embedded types
	}
	types := map[string]*typeInfo{} // by "dir.Type"
	get := func(key string) *typeInfo {
		if types[key] == nil {
			types[key] = &typeInfo{}
		}
		return types[key]
	}
	fset := token.NewFileSet()
	for _, dir := range binaryPackages(t, root, modPath) {
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			imports := map[string]string{} // local name -> the module's dir
			for _, im := range f.Imports {
				p, _ := strconv.Unquote(im.Path.Value)
				rel, ok := strings.CutPrefix(p, modPath+"/")
				if !ok {
					continue
				}
				name := filepath.Base(rel)
				if im.Name != nil {
					name = im.Name.Name
				}
				imports[name] = rel
			}
			for _, decl := range f.Decls {
				switch d := decl.(type) {
				case *ast.FuncDecl:
					if d.Recv != nil && len(d.Recv.List) == 1 {
						if name := baseType(d.Recv.List[0].Type); name != "" {
							info := get(dir + "." + name)
							info.methods = append(info.methods, d.Name.Name)
						}
					}
				case *ast.GenDecl:
					for _, spec := range d.Specs {
						ts, ok := spec.(*ast.TypeSpec)
						if !ok {
							continue
						}
						st, ok := ts.Type.(*ast.StructType)
						if !ok {
							continue
						}
						info := get(dir + "." + ts.Name.Name)
						for _, field := range st.Fields.List {
							if len(field.Names) > 0 {
								continue
							}
							typ := field.Type
							if star, ok := typ.(*ast.StarExpr); ok {
								typ = star.X
							}
							switch e := typ.(type) {
							case *ast.Ident:
								info.embedded = append(info.embedded, dir+"."+e.Name)
							case *ast.SelectorExpr:
								if x, ok := e.X.(*ast.Ident); ok && imports[x.Name] != "" {
									info.embedded = append(info.embedded, imports[x.Name]+"."+e.Sel.Name)
								}
							}
						}
					}
				}
			}
		}
	}
	var names func(key string, set map[string]bool, depth int)
	names = func(key string, set map[string]bool, depth int) {
		info := types[key]
		if info == nil || depth > 5 {
			return
		}
		for _, m := range info.methods {
			set[m] = true
		}
		for _, e := range info.embedded {
			names(e, set, depth+1)
		}
	}
	if len(types) < 50 {
		t.Fatalf("found only %d types: the walk is broken", len(types))
	}
	for key := range types {
		set := map[string]bool{}
		names(key, set, 0)
		if n := len(set); n > maxMethods {
			t.Errorf("type %s has %d methods (with those it embeds from the module), over %d: split its jobs", key, n, maxMethods)
		}
	}
}

// baseType is the name of a receiver's type: T, *T, T[P] or *T[P].
func baseType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// binaryPackages lists the module's packages the three binaries import, as
// directories relative to root.
func binaryPackages(t *testing.T, root, modPath string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "./cmd/...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/...: %v", err)
	}
	var dirs []string
	for _, p := range strings.Fields(string(out)) {
		if rel, ok := strings.CutPrefix(p, modPath+"/"); ok {
			dirs = append(dirs, rel)
		}
	}
	return dirs
}

// modulePath is the module line of root's go.mod.
func modulePath(t *testing.T, root string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.TrimSpace(p)
		}
	}
	t.Fatal("go.mod: no module line")
	return ""
}

// maxPackageLines is the most lines the non-test Go files of one of the
// binaries' packages may have: past it a package does several jobs (the
// safe-restart main package once had 3,200 lines and 38 methods on one type).
const maxPackageLines = 2000

// TestNoPackageOver2000Lines counts the lines of the files `go list` builds
// into each of the module's packages the three binaries import (build tags
// as the binaries are built, test files left out).
func TestNoPackageOver2000Lines(t *testing.T) {
	root := moduleRoot(t)
	modPath := modulePath(t, root)
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Dir}}{{range .GoFiles}} {{.}}{{end}}", "./cmd/...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/...: %v", err)
	}
	packages := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || !strings.HasPrefix(fields[0], modPath+"/") {
			continue
		}
		packages++
		lines := 0
		for _, name := range fields[2:] {
			data, err := os.ReadFile(filepath.Join(fields[1], name))
			if err != nil {
				t.Fatal(err)
			}
			lines += strings.Count(string(data), "\n")
		}
		if lines > maxPackageLines {
			t.Errorf("package %s has %d lines of non-test Go, over %d: split its jobs", fields[0], lines, maxPackageLines)
		}
	}
	if packages < 30 {
		t.Fatalf("found only %d of the module's packages: the walk is broken", packages)
	}
}
