package resource

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// LoadNamed reads every *.toml below confdir/conf.d, recursively as confd
// does, or only the resource files named (as -resource takes them:
// relative to conf.d, with or without ".toml"). A broken file yields an
// error naming it, and the others still load; files not named are not even
// parsed, and a name that matches no file is an error.
func LoadNamed(s *Settings, names []string) ([]*Resource, []error) {
	dir := filepath.Join(s.ConfDir, "conf.d")
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) && len(names) > 0 {
			return nil, []error{fmt.Errorf("-resource %s: confdir %q has no conf.d directory", strings.Join(names, ", "), s.ConfDir)}
		}
		if errors.Is(err, fs.ErrNotExist) {
			s.Logger().Warnf("cannot load template resources: confdir %q has no conf.d directory", s.ConfDir)
			return nil, nil
		}
		return nil, []error{fmt.Errorf("confdir: %w", err)}
	}
	files, err := findTOML(dir)
	if err != nil {
		return nil, []error{err}
	}
	var rs []*Resource
	var errs []error
	if len(names) > 0 {
		files, errs = selectFiles(dir, files, names)
	}
	for _, f := range files {
		r, err := Load(f, s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rs = append(rs, r)
	}
	return rs, errs
}

// findTOML follows symlinked files and directories (configuration managers
// often link resources into conf.d), guarding against link loops.
func findTOML(root string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	var walk func(dir string) error
	walk = func(dir string) error {
		real, err := filepath.EvalSymlinks(dir)
		if err != nil {
			return fmt.Errorf("conf.d: %w", err)
		}
		if seen[real] {
			return nil
		}
		seen[real] = true
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("conf.d: %w", err)
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			fi, err := os.Stat(p)
			if err != nil {
				return fmt.Errorf("conf.d: %w", err)
			}
			if fi.IsDir() {
				if err := walk(p); err != nil {
					return err
				}
				continue
			}
			if ok, _ := filepath.Match("*toml", e.Name()); ok {
				out = append(out, p)
			}
		}
		return nil
	}
	if err := walk(root); err != nil {
		return nil, err
	}
	sort.Strings(out)
	return out, nil
}

// selectFiles keeps the files that names name, in conf.d order, in files.
func selectFiles(dir string, files, names []string) ([]string, []error) {
	var errs []error
	want := map[string]bool{}
	for _, n := range names {
		found := false
		clean := filepath.Clean(n)
		for _, f := range files {
			rel, err := filepath.Rel(dir, f)
			if err == nil && (rel == clean || rel == clean+".toml") {
				want[f], found = true, true
			}
		}
		if !found {
			errs = append(errs, fmt.Errorf("-resource %s: no such resource file in %s", n, dir))
		}
	}
	return slices.DeleteFunc(files, func(f string) bool { return !want[f] }), errs
}
