package wire

import (
	"encoding/json"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
)

// Op names one member of the closed set of receiver operations. A request
// whose op is not in Ops is a protocol violation, fatal to the connection.
type Op string

// The closed op set. docs/protocol.md documents every op, its args and its
// result; each op's args decode strictly (unknown fields refused).
const (
	OpAttach      Op = "attach"       // AttachArgs -> AttachResult: is the tuple covered by a current grant?
	OpRead        Op = "read"         // ReadArgs -> ReadResult
	OpWrite       Op = "write"        // WriteArgs -> WriteResult
	OpStat        Op = "stat"         // StatArgs -> StatResult
	OpList        Op = "list"         // ListArgs -> ListResult
	OpHash        Op = "hash"         // HashArgs -> HashResult
	OpExecStart   Op = "exec_start"   // ExecStartArgs -> ExecStartResult
	OpExecOutput  Op = "exec_output"  // TerminalArgs -> ExecOutputResult
	OpExecWait    Op = "exec_wait"    // TerminalArgs -> ExecWaitResult (blocks until exit or deadline)
	OpExecKill    Op = "exec_kill"    // TerminalArgs -> Empty (signals the whole process group)
	OpExecRelease Op = "exec_release" // TerminalArgs -> Empty once final (kills the group if still running; timeout if the request ends first)
	// Files larger than one frame move in chunks (docs/protocol.md "Chunked
	// files"): a read in bytes at an offset, a write staged in a transfer.
	OpReadChunk   Op = "read_chunk"   // ReadChunkArgs -> ReadChunkResult
	OpWriteBegin  Op = "write_begin"  // WriteBeginArgs -> WriteBeginResult (opens a transfer)
	OpWriteChunk  Op = "write_chunk"  // WriteChunkArgs -> WriteChunkResult (appends to it)
	OpWriteCommit Op = "write_commit" // TransferArgs -> WriteResult (checks, syncs and renames into place)
	OpWriteAbort  Op = "write_abort"  // TransferArgs -> Empty (drops the staged content)
)

// Ops lists every member of the closed op set.
var Ops = []Op{OpAttach, OpRead, OpWrite, OpStat, OpList, OpHash,
	OpExecStart, OpExecOutput, OpExecWait, OpExecKill, OpExecRelease,
	OpReadChunk, OpWriteBegin, OpWriteChunk, OpWriteCommit, OpWriteAbort}

// Valid reports whether o is a member of the closed op set.
func (o Op) Valid() bool {
	for _, k := range Ops {
		if o == k {
			return true
		}
	}
	return false
}

// Request is one client -> receiver frame. ID multiplexes requests on one
// stream and must be unique among the connection's in-flight requests; 0 is
// reserved for connection notices (see Response). Every request carries
// TupleSHA256, OpKey and Deadline; Args is the op's args object. Fence is
// the fencing token of the custodian that owns the session in a fleet
// (the create revision of its etcd owner key; docs/protocol.md
// "Fencing"): the receiver refuses a request whose token is below the
// highest it has seen for the tuple. 0 (absent) is a custodian that
// fences nothing across machines (the single-machine op store).
type Request struct {
	ID          uint64          `json:"id"`
	Op          Op              `json:"op"`
	TupleSHA256 string          `json:"tuple_sha256"`
	OpKey       string          `json:"op_key"`
	Fence       uint64          `json:"fence,omitempty"`
	Deadline    time.Time       `json:"deadline"`
	Args        json.RawMessage `json:"args"`

	args any // set by DecodeRequest: the args, decoded and validated once
}

// Response is one receiver -> client frame; exactly one of Result and Error
// is set. A Response with ID 0 is a connection notice, never an answer: it
// carries an Error, CodeUnavailable when the receiver is shutting down (no
// new request will run; requests already in flight still get their
// answers) or CodeInvalid naming the protocol violation just before the
// receiver closes the connection.
type Response struct {
	ID     uint64          `json:"id"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *errcode.Error  `json:"error,omitempty"`

	// Data and Binary are set by DecodeBinaryResponse: the answer came in a
	// binary frame, Data its bytes (see BinaryReadChunkResult).
	Data   []byte `json:"-"`
	Binary bool   `json:"-"`
}

// Empty is the args or result of ops that carry none.
type Empty struct{}

// AttachArgs asks whether a current grant covers the request's tuple.
type AttachArgs struct{}

// AttachResult describes the grant that covers the tuple.
type AttachResult struct {
	GrantGeneration uint64    `json:"grant_generation"` // admission snapshot generation
	NotAfter        time.Time `json:"not_after"`        // the grant's not_after
	Ops             []string  `json:"ops"`              // ops the grant allows
}

// ReadArgs reads a text file. Line is 1-based (0 = from the start); Limit is
// a line count (0 = to the end). Path is relative to the grant root.
type ReadArgs struct {
	Path  string `json:"path"`
	Line  int    `json:"line,omitempty"`
	Limit int    `json:"limit,omitempty"`
}

// ReadResult carries the selected text and the digest of the whole file.
// Chunked says the selected text does not fit one answer: Content is
// empty, and the client reads the file with read_chunk (checking the
// bytes against SHA256) and selects the lines itself.
type ReadResult struct {
	Content string `json:"content"`
	Size    int64  `json:"size"`   // size of the whole file
	SHA256  string `json:"sha256"` // of the whole file, for edit preconditions
	Chunked bool   `json:"chunked,omitempty"`
}

// ReadChunkArgs reads at most Length bytes of a regular file from Offset.
// Binary asks for the answer in a binary frame (docs/protocol.md "Binary
// data frames"); a receiver that predates them refuses the field.
type ReadChunkArgs struct {
	Path   string `json:"path"`
	Offset int64  `json:"offset"`
	Length int64  `json:"length"`
	Binary bool   `json:"binary,omitempty"`
}

// ReadChunkResult carries the bytes read (base64 in JSON; fewer than
// asked when the file ends or the answer bound is smaller) and the size
// of the whole file at the time of the read.
type ReadChunkResult struct {
	Data []byte `json:"data"`
	Size int64  `json:"size"`
}

// WriteBeginArgs opens a transfer that replaces Path with exactly Size
// bytes whose SHA-256 is SHA256, sent in order by write_chunk. Mode and
// the preconditions are WriteArgs'; they are checked at the begin and
// again, under the file's lock, at the commit.
type WriteBeginArgs struct {
	Path         string `json:"path"`
	Size         int64  `json:"size"`
	SHA256       string `json:"sha256"`
	Mode         uint32 `json:"mode,omitempty"`
	ExpectSHA256 string `json:"expect_sha256,omitempty"`
	ExpectAbsent bool   `json:"expect_absent,omitempty"`
	// Binary announces that the chunks will come as binary frames
	// (docs/protocol.md "Binary data frames"): a receiver that predates
	// them refuses the field by name before any such frame is sent.
	Binary bool `json:"binary,omitempty"`
}

// WriteBeginResult names the transfer.
type WriteBeginResult struct {
	TransferID string `json:"transfer_id"`
}

// WriteChunkArgs appends Data at Offset, which must equal the bytes the
// transfer has received so far.
type WriteChunkArgs struct {
	TransferID string `json:"transfer_id"`
	Offset     int64  `json:"offset"`
	Data       []byte `json:"data"`
}

// WriteChunkResult is the number of bytes the transfer holds.
type WriteChunkResult struct {
	Received int64 `json:"received"`
}

// TransferArgs names a transfer opened by write_begin on this tuple.
type TransferArgs struct {
	TransferID string `json:"transfer_id"`
}

// WriteArgs creates or truncates a file. If ExpectSHA256 is set, the write
// happens only when the current file's SHA-256 equals it ("" with
// ExpectAbsent means the file must not exist); otherwise
// precondition_failed. Mode defaults to 0644 and never depends on umask.
type WriteArgs struct {
	Path         string `json:"path"`
	Content      string `json:"content"`
	Mode         uint32 `json:"mode,omitempty"`
	ExpectSHA256 string `json:"expect_sha256,omitempty"`
	ExpectAbsent bool   `json:"expect_absent,omitempty"`
}

// WriteResult describes the file as written.
type WriteResult struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// StatArgs names one path relative to the grant root.
type StatArgs struct {
	Path string `json:"path"`
}

// StatResult describes one file system object (never following a final
// symlink).
type StatResult struct {
	Type    string    `json:"type"` // "file", "dir", "symlink", "other"
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits
	UID     uint32    `json:"uid"`
	GID     uint32    `json:"gid"`
	ModTime time.Time `json:"mtime"`
}

// ListArgs names a directory relative to the grant root.
type ListArgs struct {
	Path string `json:"path"`
}

// ListResult lists a directory, sorted by name.
type ListResult struct {
	Entries   []DirEntry `json:"entries"`
	Truncated bool       `json:"truncated"`
}

// DirEntry is one directory entry.
type DirEntry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Size int64  `json:"size"`
}

// HashArgs names files relative to the grant root.
type HashArgs struct {
	Paths []string `json:"paths"`
}

// HashResult maps each requested path to its hex SHA-256, or to "" when it
// is missing or not a regular file.
type HashResult struct {
	SHA256 map[string]string `json:"sha256"`
}

// ExecStartArgs starts a child as the grant's uid/gid in its own session and
// process group. Env is merged over the child's default environment (the
// receiver's child_env, then the grant's env, HOME defaulting to the grant
// root); nothing of the receiver's own environment is inherited. Argv[0] is
// an absolute path or a bare name looked up in the merged PATH. Cwd is
// relative to the grant root ("" is the root). OutputLimit, when set, is
// the number of output bytes to keep (0 keeps none), capped by the grant
// and the receiver; nil means their cap alone. HashAfterExit names files
// (relative to the root) the receiver hashes after the child exits; the
// digests arrive in ExecWaitResult.
type ExecStartArgs struct {
	Argv          []string          `json:"argv"`
	Cwd           string            `json:"cwd,omitempty"`
	Env           map[string]string `json:"env,omitempty"`
	OutputLimit   *int64            `json:"output_limit,omitempty"`
	HashAfterExit []string          `json:"hash_after_exit,omitempty"`
}

// ExecStartResult names the new terminal.
type ExecStartResult struct {
	TerminalID string `json:"terminal_id"`
	PID        int    `json:"pid"`
}

// TerminalArgs names a terminal started by exec_start on this tuple.
// Release is for exec_wait alone (invalid on the other ops): once the wait
// answers the exit, the terminal is forgotten in the same exchange, as
// exec_release would forget it (the command has ended, its cgroup is gone
// and the answer carries everything the terminal still held), so the
// client needs no exec_release of its own.
type TerminalArgs struct {
	TerminalID string `json:"terminal_id"`
	Release    bool   `json:"release,omitempty"`
}

// ExitStatus is how a child ended: an exit code or a signal name.
type ExitStatus struct {
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
}

// ExecOutputResult is the captured output so far (ACP terminal/output).
// Once Exit is set the output is final, and FileSHA256 carries the
// after-exit digests as exec_wait would (so a client that saw the exit
// here needs no exec_wait for them).
type ExecOutputResult struct {
	Output     string            `json:"output"`
	Truncated  bool              `json:"truncated"`
	Exit       *ExitStatus       `json:"exit,omitempty"`
	FileSHA256 map[string]string `json:"file_sha256,omitempty"`
}

// ExecWaitResult is the final status, plus the SHA-256 of each file named in
// HashAfterExit ("" when missing or not a regular file), the final output
// (Output nil when output and digests together would not fit one answer:
// then exec_output, before a release, gives it) and whether the terminal
// was released with this answer (TerminalArgs.Release).
type ExecWaitResult struct {
	Exit       ExitStatus        `json:"exit"`
	FileSHA256 map[string]string `json:"file_sha256,omitempty"`
	Output     *string           `json:"output,omitempty"`
	Truncated  bool              `json:"truncated,omitempty"`
	Released   bool              `json:"released,omitempty"`
}
