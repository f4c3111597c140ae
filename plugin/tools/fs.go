package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/custodian/acpmeta"
	"github.com/tetherdev/tether/receiver/wire"
)

// ReadResult is what read_text_file returns.
type ReadResult struct {
	Path    string // absolute, inside the computer
	Content string
}

// ReadTextFile sends one fs/read_text_file. line is 1-based (0 = from the
// start); limit is a line count (0 = to the end).
func ReadTextFile(ctx context.Context, c Call, p string, line, limit int) (ReadResult, error) {
	abs, err := c.Resolve(p)
	if err != nil {
		return ReadResult{}, err
	}
	if line < 0 || limit < 0 {
		return ReadResult{}, wire.Errorf(wire.CodeInvalid, "line and limit must not be negative")
	}
	req := acp.ReadTextFileRequest{SessionId: c.sid(), Path: abs, Meta: c.meta("read", c.Deadline)}
	if line > 0 {
		req.Line = &line
	}
	if limit > 0 {
		req.Limit = &limit
	}
	resp, err := c.Backend.ReadTextFile(ctx, req)
	if err != nil {
		return ReadResult{}, err
	}
	return ReadResult{Path: abs, Content: resp.Content}, nil
}

// ErrEmptyContent explains the one write ACP cannot carry.
const emptyContentMsg = "empty content cannot travel over ACP: acp-go-sdk's WriteTextFileRequest.Validate " +
	"refuses it on the client side; to empty a file use run_command (for example truncate -s 0 PATH)"

// WriteResult is what write_text_file returns.
type WriteResult struct {
	Path  string
	Bytes int
}

// WriteTextFile sends one fs/write_text_file. Empty content is refused here,
// before anything is sent (see emptyContentMsg).
func WriteTextFile(ctx context.Context, c Call, p, content string) (WriteResult, error) {
	abs, err := c.Resolve(p)
	if err != nil {
		return WriteResult{}, err
	}
	if content == "" {
		return WriteResult{}, wire.Errorf(wire.CodeInvalid, "write_text_file %s: %s", abs, emptyContentMsg)
	}
	_, err = c.Backend.WriteTextFile(ctx, acp.WriteTextFileRequest{SessionId: c.sid(), Path: abs, Content: content,
		Meta: c.meta("write", c.Deadline)})
	if err != nil {
		return WriteResult{}, err
	}
	return WriteResult{Path: abs, Bytes: len(content)}, nil
}

// EditResult is what edit_text_file returns.
type EditResult struct {
	Path           string
	PreviousSHA256 string // of the content read; the write required it
	SHA256         string // of the content written
}

// EditTextFile reads the file, replaces oldText, which must occur exactly
// once, with newText, and writes the result with `_meta["tether/expect"]`
// naming the SHA-256 of the content it read: if the file changed in
// between, the client refuses the write (precondition_failed) and no
// update is lost.
func EditTextFile(ctx context.Context, c Call, p, oldText, newText string) (EditResult, error) {
	abs, err := c.Resolve(p)
	if err != nil {
		return EditResult{}, err
	}
	if oldText == "" {
		return EditResult{}, wire.Errorf(wire.CodeInvalid, "edit_text_file: old_text must not be empty")
	}
	read, err := c.Backend.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: c.sid(), Path: abs,
		Meta: c.meta("read", c.Deadline)})
	if err != nil {
		return EditResult{}, err
	}
	if n := strings.Count(read.Content, oldText); n != 1 {
		return EditResult{}, wire.Errorf(wire.CodePrecondition,
			"edit_text_file %s: old_text occurs %d times; it must occur exactly once", abs, n)
	}
	updated := strings.Replace(read.Content, oldText, newText, 1)
	if updated == "" {
		return EditResult{}, wire.Errorf(wire.CodeInvalid, "edit_text_file %s: result is empty: %s", abs, emptyContentMsg)
	}
	prev := SHA256Hex(read.Content)
	meta := acpmeta.MergeMeta(c.meta("write", c.Deadline), acpmeta.Expect{SHA256: prev}.Meta())
	if _, err := c.Backend.WriteTextFile(ctx, acp.WriteTextFileRequest{SessionId: c.sid(), Path: abs,
		Content: updated, Meta: meta}); err != nil {
		return EditResult{}, err
	}
	return EditResult{Path: abs, PreviousSHA256: prev, SHA256: SHA256Hex(updated)}, nil
}

// SHA256Hex is the lowercase hex SHA-256 of s.
func SHA256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
