package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"

	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/internal/redact"
	"github.com/keysync/confd/internal/suggest"
)

// fileKeys are confd.toml's keys, in confd 0.16's spellings (the
// dash/underscore variant is accepted too: fileKeyFlag).
var fileKeys = []string{"backend", "nodes", "prefix", "confdir", "interval", "watch", "onetime", "noop",
	"noop_show_secrets", "secret_keyring", "sync-only", "keep-stage-file", "log-level", "log-format",
	"client_cert", "client_key", "client_cakeys", "client_insecure", "basic_auth", "username", "password",
	"srv_domain", "srv_record", "scheme", "file", "filter", "check_cmd_timeout", "reload_cmd_timeout",
	"command_grace", "dest_lock_timeout", "lock_dir", "dial_timeout", "request_timeout", "wait", "resync",
	"metrics_addr", "watch_stall_timeout", "max_commands"}

// renamedKeys are the keys whose flag confd 0.16 named otherwise.
var renamedKeys = map[string]string{"nodes": "node", "client_cakeys": "client-ca-keys"}

// fileKeyFlag is the flag confd.toml's key k sets: the key's name with
// dashes, but for renamedKeys. The dash/underscore variants confd's own
// docs mix are folded.
func fileKeyFlag(k string) (string, bool) {
	for _, cand := range []string{k, strings.ReplaceAll(k, "_", "-"), strings.ReplaceAll(k, "-", "_")} {
		if slices.Contains(fileKeys, cand) {
			return cmp.Or(renamedKeys[cand], strings.ReplaceAll(cand, "_", "-")), true
		}
	}
	return "", false
}

// otherBackendKeys are confd.toml keys that only confd's other backends
// (consul, vault, dynamodb, redis, ...) read.
var otherBackendKeys = map[string]bool{
	"auth_token": true, "auth_type": true, "app_id": true, "user_id": true, "role_id": true,
	"secret_id": true, "table": true, "separator": true, "path": true,
	"client_cakeys_path": true,
}

// envKeys are the environment variables read, as confd 0.16 read the first
// three; credentials in the environment stay out of ps and unit files.
var envKeys = []struct{ env, flag string }{
	{"CONFD_CLIENT_CERT", "client-cert"},
	{"CONFD_CLIENT_KEY", "client-key"},
	{"CONFD_CLIENT_CAKEYS", "client-ca-keys"},
	{"CONFD_USERNAME", "username"},
	{"CONFD_PASSWORD", "password"},
}

// commandSecretEnv are the variables above that carry confd's etcd
// credentials (the client key's path included: a command has no business
// with confd's identity); they are removed from commands' environment.
var commandSecretEnv = []string{"CONFD_USERNAME", "CONFD_PASSWORD", "CONFD_CLIENT_KEY"}

// secretFlags never have their values echoed in errors.
var secretFlags = map[string]bool{"password": true}

// applyFileAndEnv fills every flag not given on the command line from the
// environment, then from confd.toml: flag > environment > file > default.
// confd 0.16 let the file override flags, against its own documentation.
func applyFileAndEnv(fset *pflag.FlagSet, c *Config, getenv func(string) string, log logrus.FieldLogger) error {
	onCommandLine := map[string]bool{}
	fset.Visit(func(f *pflag.Flag) { onCommandLine[f.Name] = true })
	fromEnv := map[string]bool{}
	for _, e := range envKeys {
		if v := getenv(e.env); v != "" && !onCommandLine[e.flag] {
			if err := fset.Set(e.flag, v); err != nil {
				return fmt.Errorf("environment %s: %w", e.env, err)
			}
			fromEnv[e.flag] = true
		}
	}
	path := c.ConfigFile
	raw := map[string]interface{}{}
	src, err := os.ReadFile(path)
	if err == nil {
		_, err = toml.Decode(string(src), &raw)
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && !onCommandLine["config-file"] {
			return nil // the default file is optional
		}
		if perr, ok := errors.AsType[toml.ParseError](err); ok {
			return fmt.Errorf("%s:%d: %s", path, perr.Position.Line, redact.ParseMessage(src, perr.Position.Line, perr.Message))
		}
		return fmt.Errorf("config file: %w", err)
	}
	lines := config.KeyLines(src)
	// File order, as a person reads the file.
	keys := slices.SortedFunc(maps.Keys(raw), func(a, b string) int {
		return cmp.Or(cmp.Compare(lines[a], lines[b]), strings.Compare(a, b))
	})
	where := func(k string) string {
		if l := lines[k]; l > 0 {
			return fmt.Sprintf("%s:%d", path, l)
		}
		return path
	}
	// An unknown key is an error, every one reported: a misspelt
	// "intervall" or "client_certs" ignored with a warning left confd
	// running on a default nobody chose (confd 0.16 ignored them silently).
	var unknown []error
	for _, k := range keys {
		name, known := fileKeyFlag(k)
		switch {
		case otherBackendKeys[k]:
			log.Warnf("%s: key %q is used by no backend this confd supports; ignored", where(k), k)
			continue
		case !known:
			unknown = append(unknown, fmt.Errorf("%s: %w", where(k), unknownKey(k, raw[k])))
			continue
		case onCommandLine[name] || fromEnv[name]:
			continue
		}
		if err := setFromTOML(fset, name, raw[k]); err != nil {
			return fmt.Errorf("%s: key %q: %w", where(k), k, err)
		}
	}
	return errors.Join(unknown...)
}

// unknownKey is the error for a confd.toml key confd does not read, with
// the key probably meant, as the helpers' configuration file has it.
func unknownKey(k string, v interface{}) error {
	if _, table := v.(map[string]interface{}); table {
		return fmt.Errorf("unknown key %q (confd.toml is flat: keys are settings, no [tables]; docs/operations.md lists them)", k)
	}
	// Sorted: suggest.Closest breaks ties by order, and a hint must not
	// change from one run to the next.
	if m := suggest.Closest(k, slices.Sorted(slices.Values(fileKeys))); m != "" {
		return fmt.Errorf("unknown key %q; did you mean %q?", k, m)
	}
	return fmt.Errorf("unknown key %q: not a confd.toml key (docs/operations.md lists them)", k)
}

func setFromTOML(fset *pflag.FlagSet, name string, v interface{}) error {
	values, ok := v.([]interface{})
	if !ok {
		values = []interface{}{v}
	}
	list, isList := fset.Lookup(name).Value.(pflag.SliceValue) // -node, -file, -resource
	if len(values) != 1 && !isList {
		return errors.New("takes a single value, not a list")
	}
	var ss []string
	for _, item := range values {
		switch x := item.(type) {
		case string:
			ss = append(ss, x)
		case bool, int64, float64:
			ss = append(ss, fmt.Sprint(x))
		default:
			return fmt.Errorf("unsupported value type %T", item)
		}
	}
	if isList {
		// A file's list replaces the flag's default rather than adding to it.
		return list.Replace(ss)
	}
	err := fset.Set(name, ss[0])
	if err != nil && secretFlags[name] {
		return errors.New("invalid value")
	}
	return err
}

// validate rejects combinations that would fail later in a less clear way.
func validate(c *Config) error {
	if !backends.Supported(c.Store.Backend) {
		return fmt.Errorf("-backend %q is not supported: use one of %s", c.Store.Backend, strings.Join(backends.Names(), ", "))
	}
	if c.Store.Backend == "file" && len(c.Store.YAMLFiles) == 0 {
		return errors.New("-backend=file needs at least one -file")
	}
	if c.Watch && !backends.CanWatch(c.Store.Backend) {
		return fmt.Errorf("-watch needs the etcd backend; -backend=%s can only be polled with -interval", c.Store.Backend)
	}
	if c.Interval <= 0 && !c.OneTime && !c.Watch {
		return fmt.Errorf("-interval %d must be positive", c.Interval)
	}
	if c.Store.Scheme != "http" && c.Store.Scheme != "https" {
		return fmt.Errorf("-scheme %q: want http or https", c.Store.Scheme)
	}
	if (c.Store.ClientCert == "") != (c.Store.ClientKey == "") {
		return errors.New("-client-cert and -client-key go together")
	}
	// In --help's order, so that of several bad values the same one is
	// named at every run (a map's order is random).
	for _, d := range []struct {
		name string
		v    interface{ Seconds() float64 }
	}{
		{"-check-cmd-timeout", c.CheckCmdTimeout}, {"-command-grace", c.CommandGrace},
		{"-dest-lock-timeout", c.DestLockTimeout}, {"-dial-timeout", c.Store.DialTimeout},
		{"-reload-cmd-timeout", c.ReloadCmdTimeout}, {"-request-timeout", c.Store.RequestTimeout},
		{"-watch-stall-timeout", c.Store.WatchStallTimeout},
	} {
		if d.v.Seconds() <= 0 {
			return fmt.Errorf("%s must be positive", d.name)
		}
	}
	// A relative one would be another directory for each working
	// directory: confds would not share a destination's lock.
	if !filepath.IsAbs(c.LockDir) {
		return fmt.Errorf("-lock-dir %q must be an absolute path", c.LockDir)
	}
	if c.MaxCommands < 1 {
		return fmt.Errorf("-max-commands %d must be at least 1", c.MaxCommands)
	}
	if c.Resync < 0 {
		return fmt.Errorf("-resync %s must not be negative (0 turns it off)", c.Resync)
	}
	return nil
}

// authoringFlags rejects -check-config, -validate and -mock-data used in a
// way that would silently do something else.
func authoringFlags(c *Config) error {
	switch {
	case c.CheckConfig && c.Validate:
		return errors.New("-check-config and -validate are separate runs: use one")
	case c.Validate && c.MockData == "":
		return errors.New("-validate needs -mock-data FILE: it renders from that file, never from a store")
	case c.MockData != "" && !c.Validate:
		return errors.New("-mock-data is only read with -validate")
	}
	return nil
}

// checkFileKey says what applyFileAndEnv would make of one confd.toml key,
// for -check-config, applying it to a scratch configuration only.
func checkFileKey(k string, v interface{}) error {
	name, known := fileKeyFlag(k)
	switch {
	case otherBackendKeys[k]:
		return fmt.Errorf("key %q is used by no backend this confd supports (ignored)", k)
	case !known:
		return unknownKey(k, v)
	}
	fset := newFlagSet(&Config{}, io.Discard)
	if err := setFromTOML(fset, name, v); err != nil {
		return fmt.Errorf("key %q: %w", k, err)
	}
	return nil
}
