// Package resource is confd's template resource: the TOML file that says
// which keys, which template, which destination and which commands, read
// and validated. The write path that carries one out is apply's.
package resource

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	texttemplate "text/template"

	"github.com/BurntSushi/toml"
	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/waitspec"
)

// Defaults for the command timeouts when neither the resource nor a flag sets them.
const (
	DefaultCheckTimeout  = 60 * time.Second
	DefaultReloadTimeout = 10 * time.Minute
)

// Settings are the process-wide options that shape how resources load.
type Settings struct {
	ConfDir       string        // confd's -confdir: resources in conf.d/, templates in templates/
	Prefix        string        // global -prefix; when set it replaces each resource's prefix, as in confd 0.16
	CheckTimeout  time.Duration // default check_cmd timeout
	ReloadTimeout time.Duration // default reload_cmd timeout
	Log           logrus.FieldLogger
}

// Resource is one parsed and validated template resource.
type Resource struct {
	File          string // the TOML file it came from
	Src           string // absolute template path
	Dest          string
	Keys          []string // as written in the file, before the prefix
	Prefix        string   // always starts with "/"
	UID, GID      int
	Mode          os.FileMode // zero: keep the destination's mode, 0644 for a new file
	CheckCmd      string
	ReloadCmd     string
	CheckTimeout  time.Duration
	ReloadTimeout time.Duration
	// Wait is the resource's own quiescence (TOML wait = "MIN[:MAX]");
	// nil means the daemon's -wait.
	Wait *waitspec.Spec
}

// tomlTemplate mirrors confd's [template] table.
type tomlTemplate struct {
	Src           string   `toml:"src"`
	Dest          string   `toml:"dest"`
	Keys          []string `toml:"keys"`
	Prefix        string   `toml:"prefix"`
	Owner         string   `toml:"owner"`
	Group         string   `toml:"group"`
	UID           *int     `toml:"uid"`
	GID           *int     `toml:"gid"`
	Mode          string   `toml:"mode"`
	CheckCmd      string   `toml:"check_cmd"`
	ReloadCmd     string   `toml:"reload_cmd"`
	CheckTimeout  string   `toml:"check_cmd_timeout"`
	ReloadTimeout string   `toml:"reload_cmd_timeout"`
	Wait          *string  `toml:"wait"`
}

// Load reads one resource file. The error names the file and, for TOML
// syntax errors, the line.
func Load(file string, s *Settings) (*Resource, error) {
	var tf struct {
		Template *tomlTemplate `toml:"template"`
	}
	md, err := toml.DecodeFile(file, &tf)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return nil, fmt.Errorf("%s:%d: %s", file, perr.Position.Line, perr.Message)
		}
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if tf.Template == nil {
		return nil, fmt.Errorf("%s: no [template] table", file)
	}
	// An unknown key is an error, not a warning: "checkcmd", or check_cmd
	// written above [template], would otherwise let unchecked content go live.
	if undecoded := md.Undecoded(); len(undecoded) > 0 {
		return nil, unknownKeyError(file, undecoded[0])
	}
	t := tf.Template
	r := &Resource{File: file, Dest: t.Dest, Keys: t.Keys, CheckCmd: t.CheckCmd, ReloadCmd: t.ReloadCmd}
	if t.Src == "" {
		return nil, fmt.Errorf("%s: template.src is empty", file)
	}
	if t.Dest == "" {
		return nil, fmt.Errorf("%s: template.dest is empty", file)
	}
	r.Src = filepath.Join(s.ConfDir, "templates", t.Src)
	if fi, err := os.Stat(r.Src); err != nil {
		return nil, fmt.Errorf("%s: template.src: %w", file, err)
	} else if fi.IsDir() {
		return nil, fmt.Errorf("%s: template.src %s is a directory", file, r.Src)
	}
	if r.Prefix = cmp.Or(s.Prefix, t.Prefix); !strings.HasPrefix(r.Prefix, "/") {
		r.Prefix = "/" + r.Prefix
	}
	if r.Mode, err = parseMode(t.Mode); err != nil {
		return nil, fmt.Errorf("%s: template.mode: %w", file, err)
	}
	if t.Mode != "" && !strings.HasPrefix(t.Mode, "0") {
		s.Logger().Warnf("%s: mode %q read as octal %#o (confd 0.16 read it as decimal); write %q to silence this", file, t.Mode, r.Mode, "0"+t.Mode)
	}
	if r.UID, r.GID, err = owner(t); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if r.CheckTimeout, err = duration(t.CheckTimeout, s.CheckTimeout, DefaultCheckTimeout); err != nil {
		return nil, fmt.Errorf("%s: template.check_cmd_timeout: %w", file, err)
	}
	if r.ReloadTimeout, err = duration(t.ReloadTimeout, s.ReloadTimeout, DefaultReloadTimeout); err != nil {
		return nil, fmt.Errorf("%s: template.reload_cmd_timeout: %w", file, err)
	}
	if t.Wait != nil {
		w, err := waitspec.Parse(*t.Wait)
		if err != nil {
			return nil, fmt.Errorf("%s: template.wait: %w", file, err)
		}
		r.Wait = &w
	}
	// Parse the command templates now so that a typo fails at load, not after a render.
	for key, cmd := range map[string]string{"check_cmd": r.CheckCmd, "reload_cmd": r.ReloadCmd} {
		if _, err := ExpandCommand(key, cmd, "", ""); err != nil {
			return nil, fmt.Errorf("%s: template.%s: %w", file, key, err)
		}
	}
	return r, nil
}

// StoreKeys are the keys to read from the store: each key joined to the prefix.
func (r *Resource) StoreKeys() []string {
	out := make([]string, len(r.Keys))
	for i, k := range r.Keys {
		out[i] = path.Join(r.Prefix, k)
	}
	return out
}

// Name is the resource file, which orders resources and names them in logs
// and metrics.
func (r *Resource) Name() string { return r.File }

// Destination is the file the resource writes, cleaned, so that the daemon
// can tell two resources that write one file.
func (r *Resource) Destination() string { return filepath.Clean(r.Dest) }

// Quiescence is the resource's own wait, if it sets one.
func (r *Resource) Quiescence() (waitspec.Spec, bool) {
	if r.Wait == nil {
		return waitspec.Spec{}, false
	}
	return *r.Wait, true
}

// parseMode reads an octal permission string. confd 0.16 used base 0, so
// "644" meant decimal 644 (mode 01204); here digits are always octal.
func parseMode(s string) (os.FileMode, error) {
	if s == "" {
		return 0, nil
	}
	t := strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0O")
	v, err := strconv.ParseUint(t, 8, 32)
	if err != nil {
		return 0, fmt.Errorf("%q is not an octal file mode", s)
	}
	if v > 0o7777 {
		return 0, fmt.Errorf("%q is larger than 07777", s)
	}
	// The setuid, setgid and sticky bits are os.FileMode's own.
	m := os.FileMode(v & 0o777)
	if v&0o4000 != 0 {
		m |= os.ModeSetuid
	}
	if v&0o2000 != 0 {
		m |= os.ModeSetgid
	}
	if v&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m, nil
}

// owner resolves uid/gid. confd's default is the process's own effective
// ids; owner and group names are looked up, and a name contradicting a
// numeric id is an error rather than a silent choice.
func owner(t *tomlTemplate) (uid, gid int, err error) {
	uid, gid = os.Geteuid(), os.Getegid()
	if t.Owner != "" {
		u, err := user.Lookup(t.Owner)
		if err != nil {
			return 0, 0, fmt.Errorf("template.owner: %w", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		if t.Group == "" && t.GID == nil {
			gid, _ = strconv.Atoi(u.Gid)
		}
		if t.UID != nil && *t.UID != uid {
			return 0, 0, fmt.Errorf("template.owner %q is uid %d but template.uid is %d", t.Owner, uid, *t.UID)
		}
	} else if t.UID != nil {
		uid = *t.UID
	}
	if t.Group != "" {
		g, err := user.LookupGroup(t.Group)
		if err != nil {
			return 0, 0, fmt.Errorf("template.group: %w", err)
		}
		gid, _ = strconv.Atoi(g.Gid)
		if t.GID != nil && *t.GID != gid {
			return 0, 0, fmt.Errorf("template.group %q is gid %d but template.gid is %d", t.Group, gid, *t.GID)
		}
	} else if t.GID != nil {
		gid = *t.GID
	}
	return uid, gid, nil
}

// duration reads a command timeout; without one it is the flag's, or
// without that (zero) the built-in default.
func duration(s string, flagDefault, builtin time.Duration) (time.Duration, error) {
	if s == "" {
		return cmp.Or(flagDefault, builtin), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, fmt.Errorf("%q must be positive", s)
	}
	return d, nil
}

// Logger is s.Log, or logrus's standard logger.
func (s *Settings) Logger() logrus.FieldLogger {
	if s.Log == nil {
		return logrus.StandardLogger()
	}
	return s.Log
}

// ExpandCommand fills {{.src}} and {{.dest}} in a check_cmd or reload_cmd.
func ExpandCommand(name, cmd, src, dest string) (string, error) {
	if cmd == "" {
		return "", nil
	}
	t, err := texttemplate.New(name).Option("missingkey=error").Parse(cmd)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	err = t.Execute(&b, map[string]string{"src": src, "dest": dest})
	return b.String(), err
}
