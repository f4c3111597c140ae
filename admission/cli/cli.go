// Package cli is the one command-line convention of tether's binaries
// (docs/decisions.md "One CLI convention across the binaries"):
//
//   - -h, -help and --help, at top level or after a subcommand, print
//     that command's usage to stdout, once, and exit 0;
//   - a usage error prints the error and a one-line hint
//     ("run "PROG --help" for usage") to stderr and exits 2;
//   - the flag list spells every flag --name, as the usage lines do (Go's
//     flag package accepts -name and --name alike), and prints a default
//     once: a flag whose usage text already says "(default" gets no second
//     "(default X)".
//
// It is a leaf (standard library only) beside admission/strictjson, which
// every component already links.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// Exit codes every binary shares; 1 and above 2 are the binary's own.
const (
	ExitOK    = 0
	ExitUsage = 2
)

// IsHelp reports whether arg asks for help: -h, -help or --help.
func IsHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help"
}

// NewFlagSet returns a ContinueOnError flag set named prog, the command as
// typed ("tether-admission keygen"), whose Usage prints the synopsis, the
// text and the flags to fs.Output().
func NewFlagSet(prog, synopsis, text string) *flag.FlagSet {
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	SetUsage(fs, prog, synopsis, text)
	return fs
}

// SetUsage renames fs to prog (flags already defined stay), makes it
// ContinueOnError and sets its Usage as NewFlagSet does. synopsis follows
// "usage: " verbatim; text may be empty.
func SetUsage(fs *flag.FlagSet, prog, synopsis, text string) {
	fs.Init(prog, flag.ContinueOnError)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: %s\n", synopsis)
		if text != "" {
			fmt.Fprintf(w, "\n%s\n", strings.TrimRight(text, "\n"))
		}
		if hasFlags(fs) {
			fmt.Fprint(w, "\nflags:\n")
			PrintFlags(w, fs)
		}
	}
}

// Parse parses args with fs. For -h, -help or --help it prints fs.Usage to
// stdout and returns (ExitOK, true); for a flag error it prints the error
// and the hint to stderr and returns (ExitUsage, true). done is false when
// the caller goes on. fs's output is stderr afterwards, and its Usage is
// printed at most once.
func Parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, done bool) {
	usage := fs.Usage
	fs.Usage = func() {} // the flag package would print it on every error
	fs.SetOutput(stderr) // where the flag package prints the error itself
	err := fs.Parse(args)
	fs.Usage = usage
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		fs.SetOutput(stderr)
		return ExitOK, true
	case err != nil:
		Hint(stderr, fs.Name())
		return ExitUsage, true
	}
	return ExitOK, false
}

// Hint prints the one line that follows every usage error.
func Hint(w io.Writer, prog string) {
	fmt.Fprintf(w, "run %q for usage\n", prog+" --help")
}

// UsageError prints "PROG: MESSAGE" and the hint to stderr and returns
// ExitUsage.
func UsageError(stderr io.Writer, prog, format string, args ...any) int {
	fmt.Fprintf(stderr, "%s: %s\n", prog, fmt.Sprintf(format, args...))
	Hint(stderr, prog)
	return ExitUsage
}

// PrintFlags writes fs's flags in lexical order, as flag.PrintDefaults
// does but spelled --name, with one default per flag.
func PrintFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		var b strings.Builder
		name, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(&b, "  --%s", f.Name)
		if name != "" {
			fmt.Fprintf(&b, " %s", name)
		}
		b.WriteString("\n    \t")
		b.WriteString(strings.ReplaceAll(usage, "\n", "\n    \t"))
		if !isZero(f) && !strings.Contains(usage, "(default") {
			if name == "string" {
				fmt.Fprintf(&b, " (default %q)", f.DefValue)
			} else {
				fmt.Fprintf(&b, " (default %s)", f.DefValue)
			}
		}
		fmt.Fprintln(w, b.String())
	})
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// isZero reports whether f's default is its type's zero value, which the
// listing leaves out (as flag.PrintDefaults does).
func isZero(f *flag.Flag) (zero bool) {
	defer func() {
		if recover() != nil {
			zero = false // a Value whose zero String panics: print the default
		}
	}()
	t := reflect.TypeOf(f.Value)
	var z reflect.Value
	if t.Kind() == reflect.Pointer {
		z = reflect.New(t.Elem())
	} else {
		z = reflect.Zero(t)
	}
	return f.DefValue == z.Interface().(flag.Value).String()
}
