package acptest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"strings"

	acp "github.com/coder/acp-go-sdk"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
)

// ReadTextFile serves fs/read_text_file from Root.
func (c *Client) ReadTextFile(ctx context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	if _, err := c.check("fs/read_text_file", p.SessionId, p.Path, p.Meta); err != nil {
		return acp.ReadTextFileResponse{}, err
	}
	lp, err := c.local(p.Path)
	if err != nil {
		return acp.ReadTextFileResponse{}, acperr.NewError(errcode.CodePathEscape, "%v", err)
	}
	b, err := os.ReadFile(lp)
	if errors.Is(err, fs.ErrNotExist) {
		return acp.ReadTextFileResponse{}, acperr.NewError(errcode.CodeNotFound, "%s does not exist", p.Path)
	} else if err != nil {
		return acp.ReadTextFileResponse{}, acperr.NewError(errcode.CodeInternal, "read: %v", err)
	}
	content := selectLines(string(b), p.Line, p.Limit)
	if c.AfterRead != nil {
		c.AfterRead(p.Path)
	}
	return acp.ReadTextFileResponse{Content: content}, nil
}

func selectLines(s string, line, limit *int) string {
	if line == nil && limit == nil {
		return s
	}
	lines := strings.SplitAfter(s, "\n")
	start := 0
	if line != nil && *line > 1 {
		start = min(*line-1, len(lines))
	}
	end := len(lines)
	if limit != nil && start+*limit < end {
		end = start + *limit
	}
	return strings.Join(lines[start:end], "")
}

// WriteTextFile serves fs/write_text_file into Root, honouring
// `_meta["tether/expect"]` (compare and write under the client's lock).
func (c *Client) WriteTextFile(ctx context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	call, err := c.check("fs/write_text_file", p.SessionId, p.Path, p.Meta)
	if err != nil {
		return acp.WriteTextFileResponse{}, err
	}
	lp, err := c.local(p.Path)
	if err != nil {
		return acp.WriteTextFileResponse{}, acperr.NewError(errcode.CodePathEscape, "%v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := call.Expect; e != nil {
		cur, rerr := os.ReadFile(lp)
		sum := sha256.Sum256(cur)
		switch {
		case e.Absent && rerr == nil:
			return acp.WriteTextFileResponse{}, acperr.NewError(errcode.CodePrecondition, "%s exists", p.Path)
		case !e.Absent && (rerr != nil || hex.EncodeToString(sum[:]) != e.SHA256):
			return acp.WriteTextFileResponse{}, acperr.NewError(errcode.CodePrecondition,
				"%s changed since it was read: sha256 is not %s", p.Path, e.SHA256)
		}
	}
	if err := os.WriteFile(lp, []byte(p.Content), 0o644); err != nil {
		return acp.WriteTextFileResponse{}, acperr.NewError(errcode.CodeInternal, "write: %v", err)
	}
	return acp.WriteTextFileResponse{}, nil
}
