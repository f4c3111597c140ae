package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/tetherdev/tether/qmpinput"
)

// qmpTimeout bounds one QMP exchange.
const qmpTimeout = 10 * time.Second

// qmpExecute runs one QMP command (no arguments) on the socket at path,
// reached with qmpinput's pins for owner (QEMU's uid), and returns its
// "return" member. Events QEMU sends meanwhile are skipped.
func qmpExecute(ctx context.Context, path string, owner uint32, command string) (json.RawMessage, error) {
	return qmpExecuteArgs(ctx, path, owner, command, nil)
}

// qmpExecuteArgs is qmpExecute with arguments (nil: none).
func qmpExecuteArgs(ctx context.Context, path string, owner uint32, command string, args any) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, qmpTimeout)
	defer cancel()
	c, err := qmpinput.DialPinned(ctx, path, owner)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	r := bufio.NewReaderSize(c, 64<<10)
	if _, err := qmpReply(r); err != nil { // the greeting
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	for _, cmd := range []string{"qmp_capabilities", command} {
		line, err := json.Marshal(struct {
			Execute   string `json:"execute"`
			Arguments any    `json:"arguments,omitempty"`
		}{cmd, map[bool]any{true: args}[cmd == command]})
		if err != nil {
			return nil, err
		}
		if _, err := c.Write(append(line, '\n')); err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, err)
		}
		ret, err := qmpReply(r)
		if err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, err)
		}
		if cmd == command {
			return ret, nil
		}
	}
	return nil, nil
}

// qmpReply reads lines until a greeting, a return or an error.
func qmpReply(r *bufio.Reader) (json.RawMessage, error) {
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var m struct {
			QMP    json.RawMessage `json:"QMP"`
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
		}
		if err := json.Unmarshal(line, &m); err != nil {
			return nil, fmt.Errorf("malformed QMP line: %w", err)
		}
		switch {
		case m.Error != nil:
			return nil, fmt.Errorf("QMP error %s: %s", m.Error.Class, m.Error.Desc)
		case m.Return != nil:
			return m.Return, nil
		case m.QMP != nil:
			return m.QMP, nil
		}
	}
}

// qmpStatus is QMP query-status's answer.
type qmpStatus struct {
	Running bool   `json:"running"`
	Status  string `json:"status"`
}
