package toolplan

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/plugin/contract"
)

// Read plans one fs/read_text_file. line is 1-based (0 = from the start);
// limit is a line count (0 = to the end).
func (c Call) Read(p string, line, limit int) (contract.ReadStep, error) {
	abs, err := c.Resolve(p)
	if err != nil {
		return contract.ReadStep{}, err
	}
	if line < 0 || limit < 0 {
		return contract.ReadStep{}, errcode.Errorf(errcode.CodeInvalid, "line and limit must not be negative")
	}
	st := contract.ReadStep{Path: abs, Meta: c.meta("read", c.Deadline)}
	if line > 0 {
		st.Line = &line
	}
	if limit > 0 {
		st.Limit = &limit
	}
	return st, nil
}

// emptyContentMsg explains the one write ACP cannot carry.
const emptyContentMsg = "empty content cannot travel over ACP: acp-go-sdk's WriteTextFileRequest.Validate " +
	"refuses it on the client side; to empty a file use run_command (for example truncate -s 0 PATH)"

// Write plans one fs/write_text_file. Empty content is refused here,
// before anything is sent (see emptyContentMsg).
func (c Call) Write(p, content string) (contract.WriteStep, error) {
	abs, err := c.Resolve(p)
	if err != nil {
		return contract.WriteStep{}, err
	}
	if content == "" {
		return contract.WriteStep{}, errcode.Errorf(errcode.CodeInvalid, "write_text_file %s: %s", abs, emptyContentMsg)
	}
	return contract.WriteStep{Path: abs, Content: content, Meta: c.meta("write", c.Deadline)}, nil
}

// Edit plans edit_text_file: a read, then the write ApplyEdit computes,
// carrying `_meta["tether/expect"]` with the SHA-256 of the content read,
// so that if the file changed in between the client refuses the write
// (precondition_failed) and no update is lost.
func (c Call) Edit(p, oldText, newText string) (contract.EditStep, error) {
	abs, err := c.Resolve(p)
	if err != nil {
		return contract.EditStep{}, err
	}
	if oldText == "" {
		return contract.EditStep{}, errcode.Errorf(errcode.CodeInvalid, "edit_text_file: old_text must not be empty")
	}
	return contract.EditStep{Path: abs, OldText: oldText, NewText: newText,
		ReadMeta: c.meta("read", c.Deadline), WriteMeta: c.meta("write", c.Deadline)}, nil
}

// ApplyEdit is the edit an EditStep asks for: content with oldText, which
// must occur exactly once, replaced by newText, and the SHA-256 of content
// (the write's `tether/expect`). An empty result is refused: ACP cannot
// carry it.
func ApplyEdit(path, content, oldText, newText string) (updated, expectSHA256 string, err error) {
	if n := strings.Count(content, oldText); n != 1 || oldText == "" {
		return "", "", errcode.Errorf(errcode.CodePrecondition,
			"edit_text_file %s: old_text occurs %d times; it must occur exactly once", path, n)
	}
	updated = strings.Replace(content, oldText, newText, 1)
	if updated == "" {
		return "", "", errcode.Errorf(errcode.CodeInvalid, "edit_text_file %s: result is empty: %s", path, emptyContentMsg)
	}
	return updated, SHA256Hex(content), nil
}

// SHA256Hex is the lowercase hex SHA-256 of s.
func SHA256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
