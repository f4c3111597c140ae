package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/tetherdev/tether/custodian/agentprofile"
)

// applyProfile fits the run to the agent profile: the agent's package is
// found above its entry point (a version the tests did not run is warned
// about) and its tree is shown read-only to the jail; a policy file is
// written, shown read-only to the jail and named on the agent's command
// line. The caller removes what cleanup names once the agent is gone.
func (r *runner) applyProfile(p *agentprofile.Profile) (cleanup func(), err error) {
	cleanup = func() {}
	r.env = p.Env(os.Environ())
	if p.Package != "" {
		in, err := p.FindInstall(r.argv)
		switch {
		case err != nil:
			fmt.Fprintf(r.stderr, "tether-custodian: warning: %v: cannot tell its version, and its install tree is not shown to the jail (add --jail-read)\n", err)
		default:
			if w := p.VersionWarning(in.Version); w != "" {
				fmt.Fprintf(r.stderr, "tether-custodian: warning: %s\n", w)
			}
			r.jail.read = append(r.jail.read, in.ReadRoot)
		}
	}
	if p.Policy == nil {
		return cleanup, nil
	}
	path, err := writePolicy(p.Policy)
	if err != nil {
		return cleanup, fmt.Errorf("%s profile: write %s: %w", p.Name, p.Policy.FileName, err)
	}
	r.jail.read = append(r.jail.read, path)
	r.argv = append(r.argv, p.Policy.Flag, path)
	return func() { os.RemoveAll(filepath.Dir(path)) }, nil
}

// writePolicy writes the policy, mode 0444, into a new directory (0755,
// random name, made by this process, so nobody else can have put a file
// there first) in the temporary directory, and returns its path. The
// jail shows it read-only at the same path.
func writePolicy(p *agentprofile.Policy) (string, error) {
	dir, err := os.MkdirTemp("", "tether-agent-profile-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, p.FileName)
	err = os.WriteFile(path, []byte(p.Content), 0o444)
	if err == nil {
		err = os.Chmod(path, 0o444) // whatever the umask
	}
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return path, nil
}

// cmdAgents lists the agent profiles and what each one sets.
func cmdAgents(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] != "--help" && args[0] != "-help" && args[0] != "-h" {
		return fail(stderr, exitUsage, "agents: takes no arguments")
	}
	for _, p := range agentprofile.All() {
		fmt.Fprintf(stdout, "%s\n  %s\n", p.Name, p.About)
		if p.Package != "" {
			fmt.Fprintf(stdout, "  tested:        %s %s (another version: a warning)\n", p.Package, strings.Join(p.Tested, ", "))
			fmt.Fprintf(stdout, "  jail shows:    the %s tree above the entry point, read-only\n", p.JailRead)
		}
		if p.Permission != "" {
			fmt.Fprintf(stdout, "  permission:    %s (when the config sets none)\n", p.Permission)
		}
		if len(p.SessionMeta) > 0 {
			meta, _ := json.Marshal(p.SessionMeta)
			fmt.Fprintf(stdout, "  session _meta: %s\n", meta)
		}
		if len(p.DeniedTools) > 0 {
			fmt.Fprintf(stdout, "  denied tools:  %s\n", strings.Join(p.DeniedTools, ", "))
		}
		if p.Policy != nil {
			fmt.Fprintf(stdout, "  policy file:   %s, written by tether, read-only in the jail, passed as %s PATH:\n", p.Policy.FileName, p.Policy.Flag)
			for _, l := range strings.Split(strings.TrimRight(p.Policy.Content, "\n"), "\n") {
				fmt.Fprintf(stdout, "                 %s\n", l)
			}
		}
		if len(p.SetEnv) > 0 || len(p.UnsetEnv) > 0 {
			fmt.Fprintf(stdout, "  environment:   set %s; unset %s\n", orNone(p.SetEnv), orNone(p.UnsetEnv))
		}
	}
	return exitOK
}

func orNone(ss []string) string {
	if len(ss) == 0 {
		return "nothing"
	}
	return strings.Join(ss, " ")
}
