// Package cli is the command-line scaffolding the two helpers share
// (kube-apiserver-safe-restart and kube-apiserver-sa-signer), on
// spf13/cobra: the root command with --config, --log-level and
// --log-format, the etcd flags (etcdctl's names and ETCDCTL_* variables),
// the configuration file's place in the precedence (flag > environment >
// file > default), "did you mean" on an unknown flag, confd's log format,
// and the mapping of a command's outcome to an exit code. Each helper only
// adds its commands and their own flags.
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/internal/logfmt"
	"github.com/keysync/confd/internal/suggest"
	"github.com/keysync/confd/internal/version"
)

// Exit codes every helper shares; a command's own start at 3.
const (
	ExitOK    = 0
	ExitError = 1
	ExitUsage = 2
)

// Program is one helper's command line: its name (in messages and help),
// its streams and its environment. Tests give their own.
type Program struct {
	Name           string
	Stdout, Stderr io.Writer
	// LookupEnv reads the environment (os.LookupEnv).
	LookupEnv func(string) (string, bool)
	// DefaultConfig is --config's default, read only when present; tests
	// set "" so that they never read the host's file.
	DefaultConfig string
}

// UsageError is a command-line mistake: exit 2, with a pointer to --help.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

func Usagef(format string, a ...any) error { return &UsageError{fmt.Sprintf(format, a...)} }

// UsageIf is a usage error when bad, none otherwise: a command line's
// checks, one call each.
func UsageIf(bad bool, format string, a ...any) []error {
	if !bad {
		return nil
	}
	return []error{Usagef(format, a...)}
}

// JoinUsage is one usage error of all of errs, nil when there are none.
func JoinUsage(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return &UsageError{Msg: strings.Join(msgs, "; ")}
}

// ExitCode is a command's outcome other than success, already reported
// (logged) by the command: Execute only returns it.
type ExitCode int

func (c ExitCode) Error() string { return fmt.Sprintf("exit %d", int(c)) }

// Exit turns a command's exit code into its RunE result.
func Exit(code int) error {
	if code == ExitOK {
		return nil
	}
	return ExitCode(code)
}

// Common is what the shared flags and the configuration file say: every
// command of both helpers has it.
type Common struct {
	ConfigPath string
	LogLevel   string
	LogFormat  string
	// File is the configuration file read (nil: none).
	File *config.File
	// Origin says where each flag's value came from: "flag", "env NAME",
	// "FILE:LINE" or "default" (the config command prints it).
	Origin map[string]string
}

// Root is the root command with the shared persistent flags. Help goes to
// Stdout, as --help did before cobra; errors are Execute's to print.
func (p *Program) Root(c *Common, use, short, long string) *cobra.Command {
	root := &cobra.Command{
		Use: use, Short: short, Long: long,
		SilenceErrors: true, SilenceUsage: true,
	}
	root.SetOut(p.Stdout)
	root.SetErr(p.Stderr)
	root.SetFlagErrorFunc(flagError)
	fs := root.PersistentFlags()
	fs.SortFlags = false
	fs.StringVar(&c.ConfigPath, "config", p.DefaultConfig, "TOML file whose keys are the long flag names, shared by both helpers (read only when present if not given; '' reads none); a flag beats ETCDCTL_* beats the file")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "text (confd's format) or json (logs go to stderr)")
	// --version is cobra's: it prints before anything is resolved, so a
	// broken configuration file does not hide which build this is. Ours,
	// declared first, so that cobra adds no -v.
	root.Version = version.Version
	root.SetVersionTemplate(version.Text(p.Name))
	root.Flags().Bool("version", false, "print the version, the commit and its date, and exit")
	return root
}

// VersionCommand is the `version` subcommand: what --version prints.
func (p *Program) VersionCommand() *cobra.Command {
	return &cobra.Command{
		Use: "version", Short: "print the version, the commit and its date", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := io.WriteString(p.Stdout, version.Text(p.Name))
			return err
		},
	}
}

// Resolve completes a parsed command's flags: the configuration file's
// values for the flags the command line did not give and use accepts
// (nil: all), then etcdctl's environment when the command has etcd
// flags, and records where each value came from. The file's keys that
// the command has no flag for are ignored: they are another command's,
// or the other helper's.
func (p *Program) Resolve(cmd *cobra.Command, c *Common, e *Etcd, use func(name string) bool) error {
	fs := cmd.Flags()
	c.Origin = map[string]string{}
	fs.Visit(func(f *pflag.Flag) { c.Origin[f.Name] = "flag" })
	if err := p.readConfig(fs, c, use); err != nil {
		return err
	}
	if e != nil {
		if err := e.applyEnv(fs, c, p.LookupEnv); err != nil {
			return err
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if c.Origin[f.Name] == "" {
			c.Origin[f.Name] = "default"
		}
	})
	if _, err := logrus.ParseLevel(c.LogLevel); err != nil {
		return c.FromFile(Usagef("--log-level %q: %v", c.LogLevel, err))
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return c.FromFile(Usagef("--log-format %q: want text or json", c.LogFormat))
	}
	return nil
}

func (p *Program) readConfig(fs *pflag.FlagSet, c *Common, use func(string) bool) error {
	if c.ConfigPath == "" {
		return nil
	}
	if _, err := os.Stat(c.ConfigPath); err != nil && !fs.Changed("config") {
		return nil // the default, absent: no file
	}
	f, err := config.Load(c.ConfigPath)
	if err != nil {
		return Usagef("--config: %v", err)
	}
	c.File = f
	set, err := f.Apply(fs, use)
	for _, n := range set {
		c.Origin[n] = f.Where(n)
	}
	if err != nil {
		return Usagef("--config: %v", err)
	}
	return nil
}

// flagRef matches a flag named in a message.
var flagRef = regexp.MustCompile(`--([a-z0-9][a-z0-9-]*)`)

// FromFile adds to a usage error the place in the configuration file of
// every value it names that came from there: the operator fixes the file,
// not a command line they never typed.
func (c *Common) FromFile(err error) error {
	var ue *UsageError
	if err == nil || c.File == nil || !errors.As(err, &ue) {
		return err
	}
	msg := flagRef.ReplaceAllStringFunc(ue.Msg, func(m string) string {
		if where := c.File.Where(m[2:]); where != "" && c.Origin[m[2:]] == where {
			return m + " (" + where + ")"
		}
		return m
	})
	return &UsageError{msg}
}

// Logger is the helpers' logger, in confd's format (internal/logfmt): run
// as confd's check_cmd or reload_cmd, one line without time and host
// under confd's own prefix.
func (c *Common) Logger(w io.Writer, getenv func(string) string) (*logrus.Logger, error) {
	return logfmt.New(w, c.LogLevel, c.LogFormat, getenv(logfmt.ResourceEnv) != "")
}

// flagError is pflag's error, with what an unknown flag probably meant.
func flagError(cmd *cobra.Command, err error) error {
	var ne *pflag.NotExistError
	if errors.As(err, &ne) && ne.GetSpecifiedName() != "" {
		// Another command's flag: say whose, as the single flag set's
		// "does not apply to" did.
		var owners []string
		for _, c := range cmd.Root().Commands() {
			if c != cmd && c.Flags().Lookup(ne.GetSpecifiedName()) != nil && len(ne.GetSpecifiedName()) > 1 {
				owners = append(owners, c.Name())
			}
		}
		if len(owners) > 0 {
			return Usagef("%v for %s (taken by %s)", err, cmd.Name(), strings.Join(owners, ", "))
		}
		var names []string
		cmd.Flags().VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
		if m := suggest.Closest(ne.GetSpecifiedName(), names); m != "" {
			return Usagef("%v; did you mean --%s?", err, m)
		}
	}
	return Usagef("%v", err)
}

// Execute runs the command line args and returns the exit code: a
// command's own (ExitCode), or 2 for any usage error, cobra's included
// (an unknown command, a wrong number of arguments), printed as the
// helpers always have.
func (p *Program) Execute(root *cobra.Command, args []string) int {
	root.SetArgs(args)
	_, err := root.ExecuteC()
	var code ExitCode
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &code):
		return int(code)
	}
	return p.Fail(err)
}

// Fail reports a usage error as the helpers always have, and returns 2.
func (p *Program) Fail(err error) int {
	fmt.Fprintf(p.Stderr, "%s: %v\nRun '%s --help' for usage.\n", p.Name, err, p.Name)
	return ExitUsage
}

// Dispatch puts the subcommand first for cobra, which looks for it before
// it knows the flags: the helpers take flags before the subcommand
// (`--endpoints X status`), and a command line naming none is def (the
// restart, whose command follows --). The subcommand is the first
// argument before -- that is neither a flag nor a flag's value, as any of
// the commands' flags takes it. A first word no command has is a usage
// error, with the closest name.
func Dispatch(root *cobra.Command, args []string, def string) ([]string, error) {
	if len(args) > 0 && (args[0] == cobra.ShellCompRequestCmd || args[0] == cobra.ShellCompNoDescRequestCmd) {
		return args, nil // completion asks about the line as typed
	}
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	takesValue := map[string]bool{}
	var names []string
	for _, c := range root.Commands() {
		if !c.Hidden {
			names = append(names, c.Name())
		}
		c.Flags().VisitAll(func(f *pflag.Flag) {
			v := f.NoOptDefVal == ""
			takesValue["--"+f.Name] = v
			if f.Shorthand != "" {
				takesValue["-"+f.Shorthand] = v
			}
		})
	}
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) { takesValue["--"+f.Name] = true })
	// --version is the root's, wherever it is on the line and whatever
	// else it says: there is one version for every subcommand.
	if i := slices.Index(args, "--version"); i >= 0 && !slices.Contains(args[:i], "--") {
		return []string{"--version"}, nil
	}
	// help: the line asks for help; ofDef: it is def's (a command after
	// --, or a flag only the commands take), so def's help is the one it
	// asks for, as the same line without --help would run def.
	help, ofDef := false, false
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			i, ofDef = len(args), true
		case a == "-h" || a == "--help":
			help = true
		case strings.HasPrefix(a, "-") && len(a) > 1:
			name, _, hasValue := strings.Cut(a, "=")
			if long, ok := strings.CutPrefix(name, "--"); !ok || root.PersistentFlags().Lookup(long) == nil {
				ofDef = true
			}
			v, known := takesValue[name]
			if !known && strings.HasPrefix(name, "--") {
				// No command has it: what follows may be its value or
				// the subcommand, so it is reported here.
				var flags []string
				for f := range takesValue {
					if n, ok := strings.CutPrefix(f, "--"); ok {
						flags = append(flags, n)
					}
				}
				slices.Sort(flags) // a stable suggestion among equals
				if m := suggest.Closest(name[2:], flags); m != "" {
					return nil, Usagef("unknown flag: %s; did you mean --%s?", name, m)
				}
				return nil, Usagef("unknown flag: %s", name)
			}
			if v && !hasValue {
				i++
			}
		default:
			if root.Name() != "" {
				if c, _, err := root.Find([]string{a}); err == nil && c != root {
					return append(append([]string{a}, args[:i]...), args[i+1:]...), nil
				}
			}
			if m := suggest.Closest(a, names); m != "" {
				return nil, Usagef("unknown subcommand %q; did you mean %s?", a, m)
			}
			return nil, Usagef("unknown subcommand %q (want one of %s; put a %s command after --)", a, strings.Join(names, ", "), def)
		}
	}
	if help && !ofDef {
		return args, nil // the root's help, which lists the commands
	}
	return append([]string{def}, args...), nil
}
