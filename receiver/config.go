package receiver

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/receiver/spawn"
	"github.com/tetherdev/tether/receiver/transport"
)

// Config is the daemon's configuration file (docs/protocol.md "Config"),
// decoded strictly: unknown fields, a missing required field or trailing
// data are refused.
type Config struct {
	// Listen lists the channels to serve, at least one, each in the form
	// of receiver/transport's Config ("kind" unix, tls, vsock or stream;
	// the unauthenticated kinds only with host_only).
	Listen []transport.Config `json:"listen"`
	// Admission says where the signed grants are and who signs them.
	Admission AdmissionConfig `json:"admission"`
	// Landlock must name its mode explicitly ("off" or "required").
	Landlock LandlockConfig `json:"landlock"`
	// Cgroup contains each command in its own cgroup ("off" when absent;
	// docs/protocol.md recommends "required").
	Cgroup CgroupConfig `json:"cgroup,omitempty"`
	// Seccomp runs every command under the seccomp filter ("off" when
	// absent; docs/protocol.md recommends "required").
	Seccomp SeccompConfig `json:"seccomp,omitempty"`
	// Spawn is "thread", "helper" or "clone". Absent: when seccomp and
	// cgroup are both required (a filtered spawning thread cannot fork
	// into a cgroup v2), "clone" where spawn.CloneSupported, else
	// "helper"; otherwise "thread".
	Spawn string `json:"spawn,omitempty"`
	// ChildEnv is the default environment of every command (absent:
	// DefaultChildEnv; {} none). A grant's env and a request's env are
	// merged over it; HOME defaults to the grant root.
	ChildEnv map[string]string `json:"child_env,omitempty"`
	// Limits are the receiver's own bounds (zero fields take defaults).
	Limits Limits `json:"limits,omitempty"`
	// MaxFrame lowers the wire frame limit (0 keeps 1 MiB; never higher).
	MaxFrame int `json:"max_frame,omitempty"`
	// FenceState is the absolute path of the file that keeps the highest
	// fencing token per tuple across restarts (docs/protocol.md
	// "Fencing"); its directory must exist, be root's and writable by
	// nobody else. Absent: requests carrying a token are refused.
	FenceState string `json:"fence_state,omitempty"`
}

// AdmissionConfig locates the admission file and pins its signer.
type AdmissionConfig struct {
	// File is the absolute path of the admission file; no component of
	// its directory may be a symlink.
	File string `json:"file"`
	// PublicKey is the absolute path of the pinned signer's PEM public key.
	PublicKey string `json:"public_key"`
	// OwnerUID is the uid that must own the file. Required.
	OwnerUID *uint32 `json:"owner_uid"`
	// MaxBytes bounds the file (0: the admission default).
	MaxBytes int64 `json:"max_bytes,omitempty"`
}

// ErrConfig wraps every configuration refusal; the message names the field.
var ErrConfig = errors.New("receiver config")

// maxConfigBytes bounds the configuration file.
const maxConfigBytes = 1 << 20

// LoadConfig reads and strictly decodes the configuration file at path.
func LoadConfig(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return Config{}, fmt.Errorf("%w: read %s: %w", ErrConfig, path, err)
	}
	if len(data) > maxConfigBytes {
		return Config{}, fmt.Errorf("%w: %s is larger than %d bytes", ErrConfig, path, maxConfigBytes)
	}
	return DecodeConfig(data)
}

// DecodeConfig strictly decodes and validates a configuration.
func DecodeConfig(data []byte) (Config, error) {
	var c Config
	if err := strictjson.Decode(data, maxConfigBytes, &c); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return c, c.Validate()
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if len(c.Listen) == 0 {
		return fmt.Errorf("%w: listen: at least one channel is required", ErrConfig)
	}
	for i, l := range c.Listen {
		if _, err := l.Transport(nil); err != nil {
			return fmt.Errorf("%w: listen[%d]: %w", ErrConfig, i, err)
		}
	}
	if err := c.Admission.validate(); err != nil {
		return fmt.Errorf("%w: admission: %w", ErrConfig, err)
	}
	switch c.Landlock.Mode {
	case LandlockOff, LandlockRequired:
	default:
		return fmt.Errorf("%w: landlock.mode must be %q or %q, not %q", ErrConfig, LandlockOff, LandlockRequired, c.Landlock.Mode)
	}
	if err := c.Landlock.validate(); err != nil {
		return fmt.Errorf("%w: landlock: %w", ErrConfig, err)
	}
	if err := c.Cgroup.validate(); err != nil {
		return fmt.Errorf("%w: cgroup: %w", ErrConfig, err)
	}
	if err := c.Seccomp.validate(); err != nil {
		return fmt.Errorf("%w: seccomp: %w", ErrConfig, err)
	}
	if _, err := c.spawnMode(); err != nil {
		return err
	}
	if err := validateChildEnv(c.ChildEnv); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if _, err := c.Limits.withDefaults(); err != nil {
		return fmt.Errorf("%w: limits: %w", ErrConfig, err)
	}
	if c.FenceState != "" && !absClean(c.FenceState) {
		return fmt.Errorf("%w: fence_state %q is not an absolute clean path", ErrConfig, c.FenceState)
	}
	if c.MaxFrame < 0 || c.MaxFrame > 1<<20 {
		return fmt.Errorf("%w: max_frame %d not in 0..%d", ErrConfig, c.MaxFrame, 1<<20)
	}
	return nil
}

func (c Config) spawnMode() (spawn.Mode, error) {
	filteredCgroup := c.Seccomp.Mode == SeccompRequired && c.Cgroup.Mode == CgroupRequired
	switch c.Spawn {
	case "":
		if filteredCgroup {
			return filteredCgroupMode(), nil
		}
		return spawn.ModeThread, nil
	case "thread":
		if filteredCgroup {
			return 0, fmt.Errorf("%w: spawn \"thread\" with seccomp and cgroup required: %w", ErrConfig, spawn.ErrSeccompThreadCgroup)
		}
		return spawn.ModeThread, nil
	case "helper":
		return spawn.ModeHelper, nil
	case "clone":
		if err := spawn.CloneSupported(); err != nil {
			return 0, fmt.Errorf("%w: spawn \"clone\": %w", ErrConfig, err)
		}
		return spawn.ModeClone, nil
	}
	return 0, fmt.Errorf("%w: spawn must be \"thread\", \"helper\" or \"clone\", not %q", ErrConfig, c.Spawn)
}

// filteredCgroupMode is the default spawn mode with seccomp and cgroup
// both required: one fork and one exec per command (spawn.ModeClone)
// where the kernel and build allow, else the re-exec helper.
func filteredCgroupMode() spawn.Mode {
	if spawn.CloneSupported() == nil {
		return spawn.ModeClone
	}
	return spawn.ModeHelper
}

func (a AdmissionConfig) validate() error {
	switch {
	case !absClean(a.File):
		return fmt.Errorf("file %q is not an absolute clean path", a.File)
	case !absClean(a.PublicKey):
		return fmt.Errorf("public_key %q is not an absolute clean path", a.PublicKey)
	case a.OwnerUID == nil:
		return errors.New("owner_uid is required")
	case a.MaxBytes < 0:
		return errors.New("max_bytes is negative")
	}
	return nil
}

func absClean(p string) bool { return filepath.IsAbs(p) && filepath.Clean(p) == p }
