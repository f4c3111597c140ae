package receiver

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/receiver/spawn"
)

// DefaultChildEnv is the default environment of every command when the
// receiver's configuration sets no child_env: what ACP agents expect of a
// terminal (a bare "npm" or "sh" resolves, text is UTF-8). HOME is not in
// it: it defaults to the grant root (see childEnv).
var DefaultChildEnv = map[string]string{
	"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"LANG": "C.UTF-8",
}

// MaxChildEnv bounds the receiver's child_env entries.
const MaxChildEnv = 64

// validateChildEnv refuses a default environment the receiver could never
// start a command with: a malformed name or value, or a loader variable.
func validateChildEnv(env map[string]string) error {
	if len(env) > MaxChildEnv {
		return fmt.Errorf("child_env has %d entries, at most %d", len(env), MaxChildEnv)
	}
	for k, v := range env {
		switch {
		case k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0:
			return fmt.Errorf("child_env name %q is empty or contains '=' or NUL (or its value NUL)", k)
		case spawn.IsLoaderVar(k):
			return fmt.Errorf("child_env %s is a loader variable; it is refused", k)
		}
	}
	return nil
}

// childEnv is a command's whole environment, sorted: the receiver's
// default environment, the grant's env over it, HOME the grant root unless
// either set it, and the request's env over all of that. Nothing of the
// receiver's own environment is inherited. A loader variable from any
// layer is refused (denied, naming it); the grant's and the request's
// layers are named in the message.
func childEnv(defaults map[string]string, g admission.Grant, request map[string]string) ([]string, map[string]string, error) {
	merged := maps.Clone(defaults)
	if merged == nil {
		merged = map[string]string{}
	}
	for _, e := range g.Env {
		merged[e.Name] = e.Value
	}
	if _, ok := merged["HOME"]; !ok {
		merged["HOME"] = g.Tuple.Root
	}
	maps.Copy(merged, request)
	env := make([]string, 0, len(merged))
	for k, v := range merged {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	if err := spawn.CheckEnv(env); err != nil {
		code := errcode.CodeInvalid
		if errors.Is(err, spawn.ErrLoaderEnv) {
			code = errcode.CodeDenied
		}
		return nil, nil, errcode.Errorf(code, "env (the request's merged over the grant's and the receiver's): %v", err)
	}
	return env, merged, nil
}
