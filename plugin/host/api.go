// Package host is what a Go agent runtime imports to use tether-plugin:
// Load starts and verifies the plugin; Plugin.Connect names one ACP
// agent-side connection to it; Conn reports sessions, asks the ToolPolicy
// and runs the tools. docs/plugin.md shows a host in fifteen lines.
//
// The plugin decides, the host sends: each tool call is one call to the
// plugin, which answers with the call's plan (the exact ACP requests, each
// with its `_meta`) or its refusal, and Conn sends the plan on the ACP
// connection itself. Nothing is ever sent for a session without a plan the
// plugin issued for that call. Bindings, attach, fences and leases live
// in the plugin process; Conn reports back only what the plugin must
// decide on (a binding error from the client, the check after glob and
// grep).
//
// Starting the plugin needs Linux (it runs from a sealed memfd, exe_linux.go);
// on other systems the package is the same code, but Load returns
// ErrUnimplemented before it starts anything.
package host

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Errors callers branch on with errors.Is.
var (
	// ErrChecksum: the binary's SHA-256 is not the expected one (see
	// *ChecksumError) or the expected value is malformed.
	ErrChecksum = errors.New("plugin checksum")
	// ErrStart: the plugin did not complete the handshake (wrong versions,
	// no mutual TLS, crash, timeout); the error carries its stderr.
	ErrStart = errors.New("plugin start")
	// ErrCancelled is wrapped (through *CancelledError) by every tool call
	// whose caller cancelled it and whose clean-up finished: no command of
	// the call is still running or unreleased.
	ErrCancelled = errors.New("cancelled by the caller")
	// ErrBadPlan: the plugin answered a tool call with a plan this call
	// cannot carry out (another session, another tool's requests, a
	// `_meta` key outside the contract). Nothing of it was sent.
	ErrBadPlan = errors.New("plugin plan refused")
	// ErrUnimplemented: this package needs Linux.
	ErrUnimplemented = errors.New("tether plugin host: not implemented on this system (it needs Linux)")
)

// MaxPluginBytes bounds the plugin binary Load copies.
const MaxPluginBytes = 512 << 20

// ChecksumError names the path and both digests.
type ChecksumError struct {
	Path, Want, Got string
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("plugin checksum: %s has SHA-256 %s, want %s", e.Path, e.Got, e.Want)
}

// Is makes errors.Is(err, ErrChecksum) true.
func (e *ChecksumError) Is(target error) bool { return target == ErrChecksum }

// CancelledError is a tool call its caller cancelled, returned once its
// clean-up finished. For run_command, Run is the killed command's result:
// its exit says how it ended, its output so far, the op key its receipts
// carry.
type CancelledError struct {
	Tool  string
	Cause error // the caller's context error or cause
	Run   *CommandResult
}

func (e *CancelledError) Error() string {
	if e.Run != nil {
		return fmt.Sprintf("%s cancelled (%v): the command was killed and terminal %s released", e.Tool, e.Cause, e.Run.TerminalID)
	}
	return fmt.Sprintf("%s cancelled (%v)", e.Tool, e.Cause)
}

// Is makes errors.Is(err, ErrCancelled) true.
func (e *CancelledError) Is(target error) bool { return target == ErrCancelled }

// Unwrap returns the caller's cause.
func (e *CancelledError) Unwrap() error { return e.Cause }

// Option configures Load.
type Option func(*options)

type options struct {
	args         []string
	stderr       io.Writer
	logger       hclog.Logger
	startTimeout time.Duration
	versions     []int
}

// WithArgs passes arguments to the plugin binary.
func WithArgs(args ...string) Option { return func(o *options) { o.args = args } }

// WithStderr copies the plugin's raw stderr (its JSON log) to w.
func WithStderr(w io.Writer) Option { return func(o *options) { o.stderr = w } }

// WithLogger sets go-plugin's logger (default: errors to os.Stderr).
func WithLogger(l hclog.Logger) Option { return func(o *options) { o.logger = l } }

// WithStartTimeout bounds the handshake (default 30 s).
func WithStartTimeout(d time.Duration) Option { return func(o *options) { o.startTimeout = d } }

// Method is the ACP method that opened a session.
type Method int

// The two methods that may carry `_meta["tether/bind"]`.
const (
	MethodNew Method = iota + 1
	MethodLoad
)

// BindingState is a session's binding state in the plugin.
type BindingState int

// The states.
const (
	// Unbound: the session never asked to bind; the host keeps its tools.
	Unbound BindingState = iota + 1
	// Pending: the session asked to bind; no bind has succeeded yet.
	Pending
	// Bound: tuple pinned, attached on this connection, lease current.
	Bound
	// Fenced: was bound; refused until an explicit reattach.
	Fenced
)

func (s BindingState) String() string {
	switch s {
	case Unbound:
		return "unbound"
	case Pending:
		return "pending"
	case Bound:
		return "bound"
	case Fenced:
		return "fenced"
	}
	return "invalid"
}

// SessionStatus is what the plugin knows of a session.
type SessionStatus struct {
	SessionID   string
	State       BindingState
	TupleSHA256 string // empty unless a tuple is pinned
	// LeaseNotAfter is zero unless a bind succeeded.
	LeaseNotAfter   time.Time
	GrantGeneration uint64
	// Code and Message describe the last refusal or fence, if any.
	Code, Message string
}

// HostToolKind classifies a host's own tool for Conn.AllowHostTool.
type HostToolKind int

// The kinds.
const (
	// HostFilesystem reads or writes host files or host file metadata.
	HostFilesystem HostToolKind = iota + 1
	// HostProcess starts, signals or inspects host processes.
	HostProcess
	// HostOther touches neither host files nor host processes.
	HostOther
)

// CallOptions are what every tool call may set; the zero value is a fresh
// operation key and the plugin's default timeout (60 s).
type CallOptions struct {
	// OpKey retries an earlier call under its key (1-112 of
	// [A-Za-z0-9._:-]): the client answers with the original receipt.
	OpKey string
	// Timeout bounds the call (at most an hour); the lease caps it.
	Timeout time.Duration
}

// EnvVar is one environment variable of a command.
type EnvVar struct {
	Name, Value string
}

// Command is what run_command starts inside the computer.
type Command struct {
	Command string
	Args    []string
	// Cwd is relative to the tuple root, or absolute inside it; "" is the
	// root.
	Cwd string
	Env []EnvVar
	// OutputByteLimit bounds the output kept (0 = 1 MiB, at most 8 MiB).
	OutputByteLimit int
	// Verify maps a file (relative to the root, or absolute inside it) to
	// its expected SHA-256 (hex) after the command exits: the receipt is
	// then verified or failed.
	Verify map[string]string
}

// GrepOptions select grep's matching mode.
type GrepOptions struct {
	Fixed      bool // -F: the pattern is a fixed string
	IgnoreCase bool // -i
}

// The tools' results. Every result names the op key its requests carried
// (request i carries OpKey:<step>); the JSON field names are the wire
// names tools report to ACP clients.

// ReadResult is read_text_file's result.
type ReadResult struct {
	OpKey   string `json:"op_key,omitempty"`
	Path    string `json:"path,omitempty"` // absolute, inside the computer
	Content string `json:"content,omitempty"`
}

// WriteResult is write_text_file's result.
type WriteResult struct {
	OpKey string `json:"op_key,omitempty"`
	Path  string `json:"path,omitempty"`
	Bytes int    `json:"bytes,omitempty"`
}

// EditResult is edit_text_file's result.
type EditResult struct {
	OpKey string `json:"op_key,omitempty"`
	Path  string `json:"path,omitempty"`
	// PreviousSHA256 is the SHA-256 of the content read, which the write
	// required (`tether/expect`); SHA256 that of the content written.
	PreviousSHA256 string `json:"previous_sha256,omitempty"`
	SHA256         string `json:"sha256,omitempty"`
}

// DirEntry is one entry of a directory listing.
type DirEntry struct {
	Name string `json:"name,omitempty"`
	Type string `json:"type,omitempty"` // dir, file, symlink or other
}

// ListResult is list_directory's result.
type ListResult struct {
	OpKey   string     `json:"op_key,omitempty"`
	Path    string     `json:"path,omitempty"`
	Entries []DirEntry `json:"entries,omitempty"`
}

// ExitStatus is how a command ended: an exit code, or the signal that
// killed it.
type ExitStatus struct {
	ExitCode *int    `json:"exit_code,omitempty"`
	Signal   *string `json:"signal,omitempty"`
}

// CommandResult is run_command's result.
type CommandResult struct {
	OpKey      string     `json:"op_key,omitempty"`
	TerminalID string     `json:"terminal_id,omitempty"`
	Output     string     `json:"output,omitempty"`
	Truncated  bool       `json:"truncated,omitempty"`
	Exit       ExitStatus `json:"exit"`
	// TimedOut: the deadline passed and the command was killed.
	TimedOut bool `json:"timed_out,omitempty"`
	// Cancelled: the caller cancelled; the command was killed and its
	// terminal released before the call returned.
	Cancelled bool `json:"cancelled,omitempty"`
}

// GlobResult is glob's result: absolute paths, sorted.
type GlobResult struct {
	OpKey   string   `json:"op_key,omitempty"`
	Matches []string `json:"matches,omitempty"`
}

// GrepMatch is one matching line.
type GrepMatch struct {
	Path string `json:"path,omitempty"` // absolute
	Line int64  `json:"line,omitempty"`
	Text string `json:"text,omitempty"`
}

// GrepResult is grep's result.
type GrepResult struct {
	OpKey   string      `json:"op_key,omitempty"`
	Matches []GrepMatch `json:"matches,omitempty"`
}
