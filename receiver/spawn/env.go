package spawn

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// loaderPrefixes and loaderNames are environment variables that steer the
// dynamic loader or libc into loading code or data the command did not
// ask for (glibc's unsecvars plus the macOS equivalents). They are refused
// outright, never filtered silently.
var (
	loaderPrefixes = []string{"LD_", "DYLD_"}
	loaderNames    = map[string]bool{"GCONV_PATH": true, "GLIBC_TUNABLES": true, "MALLOC_TRACE": true,
		"HOSTALIASES": true, "LOCALDOMAIN": true, "LOCPATH": true, "NLSPATH": true, "RESOLV_HOST_CONF": true,
		"RES_OPTIONS": true, "NIS_PATH": true, "GETCONF_DIR": true, "TZDIR": true}
)

// IsLoaderVar reports whether name is a loader variable CheckEnv refuses.
func IsLoaderVar(name string) bool {
	for _, p := range loaderPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return loaderNames[name]
}

// CheckEnv refuses an environment entry that is not KEY=value with a
// non-empty key free of '=' and NUL, a duplicate key, or a loader
// variable (wrapping ErrLoaderEnv, naming it).
func CheckEnv(env []string) error {
	seen := make(map[string]bool, len(env))
	for _, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		switch {
		case !ok || k == "" || strings.ContainsRune(kv, 0):
			return fmt.Errorf("%w: environment entry %q is not KEY=value", ErrSpec, kv)
		case IsLoaderVar(k):
			return fmt.Errorf("%w: %s", ErrLoaderEnv, k)
		case seen[k]:
			return fmt.Errorf("%w: environment variable %s given twice", ErrSpec, k)
		}
		seen[k] = true
	}
	return nil
}

// CapError names the capabilities the spawning thread lacks.
type CapError struct {
	Missing []string // e.g. ["KILL"]
}

func (e *CapError) Error() string {
	return fmt.Sprintf("%v: %s not in the effective set", ErrCapability, strings.Join(e.Missing, ", "))
}

// Unwrap makes errors.Is(err, ErrCapability) hold.
func (e *CapError) Unwrap() error { return ErrCapability }

// spawnCaps are what starting and controlling a child needs: SETPCAP to
// empty the bounding set, SETGID and SETUID for the child's ids, KILL to
// signal a child that runs as another uid.
var spawnCaps = []struct {
	bit  uint
	name string
}{{unix.CAP_KILL, "KILL"}, {unix.CAP_SETGID, "SETGID"}, {unix.CAP_SETUID, "SETUID"}, {unix.CAP_SETPCAP, "SETPCAP"}}

// checkThreadCaps reads the calling thread's effective set (one capget)
// and refuses before anything is changed or forked if a capability a
// child's start or control needs is missing.
func checkThreadCaps() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("%w: capget: %w", ErrCapability, err)
	}
	var missing []string
	for _, c := range spawnCaps {
		if data[0].Effective&(1<<c.bit) == 0 {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		return &CapError{Missing: missing}
	}
	return nil
}
