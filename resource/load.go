package resource

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// LoadAll reads every *.toml below confdir/conf.d, recursively as confd
// does. A broken file yields an error naming it, and the others still load.
func LoadAll(s *Settings) ([]*Resource, []error) {
	dir := filepath.Join(s.ConfDir, "conf.d")
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			s.log().Warnf("cannot load template resources: confdir %q has no conf.d directory", s.ConfDir)
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
