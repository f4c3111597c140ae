package contract

import (
	"encoding/json"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/errcode"
)

// Limits both sides enforce.
const (
	// MaxCleanupTimeout bounds the clean-up time (kill, output, release)
	// a terminal plan may give the host.
	MaxCleanupTimeout = time.Minute
	// AttachTimeout bounds `_tether/attach`, on both sides.
	AttachTimeout = 30 * time.Second
)

// ToolCall is one tool call the host asks the plugin to authorize.
type ToolCall struct {
	ConnID    string
	SessionID string
	// OpKey retries an earlier call under its key; "" means a fresh key.
	OpKey string
	// Timeout bounds the call; 0 is the plugin's default.
	Timeout time.Duration
	Tool    Tool
}

// Tool is the closed set of tools: ReadTool, WriteTool, EditTool,
// ListTool, RunTool, GlobTool, GrepTool.
type Tool interface {
	// Name is the tool's name ("read_text_file").
	Name() string
	isTool()
}

// ReadTool is read_text_file: Line is 1-based (0 = from the start), Limit
// a line count (0 = to the end).
type ReadTool struct {
	Path        string
	Line, Limit int
}

// WriteTool is write_text_file.
type WriteTool struct{ Path, Content string }

// EditTool is edit_text_file: OldText must occur exactly once.
type EditTool struct{ Path, OldText, NewText string }

// ListTool is list_directory ("" = the root).
type ListTool struct{ Path string }

// RunTool is run_command.
type RunTool struct {
	Command string
	Args    []string
	Cwd     string // relative to the root, or absolute inside it; "" = root
	Env     []acp.EnvVariable
	// OutputLimit bounds the output kept (0 = the plugin's default).
	OutputLimit int
	// Verify maps a file to its expected SHA-256 (hex) after exit.
	Verify map[string]string
}

// GlobTool is glob: Pattern matches paths below Dir ("" = the root).
type GlobTool struct{ Pattern, Dir string }

// GrepTool is grep: Pattern is searched below Dir ("" = the root).
type GrepTool struct {
	Pattern, Dir      string
	Fixed, IgnoreCase bool
}

func (ReadTool) Name() string  { return "read_text_file" }
func (WriteTool) Name() string { return "write_text_file" }
func (EditTool) Name() string  { return "edit_text_file" }
func (ListTool) Name() string  { return "list_directory" }
func (RunTool) Name() string   { return "run_command" }
func (GlobTool) Name() string  { return "glob" }
func (GrepTool) Name() string  { return "grep" }

func (ReadTool) isTool()  {}
func (WriteTool) isTool() {}
func (EditTool) isTool()  {}
func (ListTool) isTool()  {}
func (RunTool) isTool()   {}
func (GlobTool) isTool()  {}
func (GrepTool) isTool()  {}

// Meta is one request's `_meta`: each value is JSON the plugin encoded
// once, sent unchanged.
type Meta map[string]json.RawMessage

// ACP returns m as the SDK's `_meta` map (values stay raw JSON).
func (m Meta) ACP() map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Plan is the per-call authorization the plugin issues and the host
// consumes: the exact requests of one tool call. The host sends them on
// its own ACP connection, for Plan.SessionID only, and nothing else.
type Plan struct {
	// Ticket names the call in Report; it is valid on its connection only.
	Ticket    string
	SessionID string
	// OpKey is the call's base operation key (request i carries
	// OpKey:<step>).
	OpKey string
	// Deadline is the tool's deadline, capped by the lease.
	Deadline time.Time
	// FenceCodes: a request refused with one of these codes, or whose
	// connection is lost, is reported (Report.Failures) before the call
	// returns; the plugin then fences the binding.
	FenceCodes []errcode.Code
	Step       Step
}

// Step is the closed set of plan steps: ReadStep, WriteStep, EditStep,
// TerminalStep.
type Step interface{ isStep() }

// ReadStep is one fs/read_text_file.
type ReadStep struct {
	Path        string
	Line, Limit *int
	Meta        Meta
}

// WriteStep is one fs/write_text_file.
type WriteStep struct {
	Path, Content string
	Meta          Meta
}

// EditStep is fs/read_text_file, then fs/write_text_file of the content
// with OldText replaced by NewText exactly once; the write's `_meta` is
// WriteMeta plus `tether/expect` with the SHA-256 of the content read.
type EditStep struct {
	Path, OldText, NewText string
	ReadMeta, WriteMeta    Meta
}

// TerminalStep is one command run to its end: terminal/create, then
// wait_for_exit until the deadline or the caller's cancel, kill if the
// wait was ended, output and release, each with its own `_meta`. Kill,
// output and release have CleanupTimeout from the moment the wait ends.
type TerminalStep struct {
	Command        string
	Args           []string
	Cwd            string
	Env            []acp.EnvVariable
	OutputLimit    int
	CleanupTimeout time.Duration
	CreateMeta     Meta
	WaitMeta       Meta
	KillMeta       Meta
	OutputMeta     Meta
	ReleaseMeta    Meta
	// Dir is the resolved directory list_directory, glob and grep report
	// their results under.
	Dir string
}

func (ReadStep) isStep()     {}
func (WriteStep) isStep()    {}
func (EditStep) isStep()     {}
func (TerminalStep) isStep() {}

// Failure is one request of a plan the client refused with a fence code,
// or whose connection was lost.
type Failure struct {
	Request   string // the ACP method
	Code      errcode.Code
	Message   string // the client's own message
	Transport bool   // the connection was lost: fate unknown
}

// Report is what the host tells the plugin about a plan it executed.
type Report struct {
	ConnID   string
	Ticket   string
	Failures []Failure
	// Check: glob or grep ended; refuse unless the binding still holds.
	Check bool
}
