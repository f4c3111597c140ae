package qmpinput

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission/backoff"
)

// ErrScript: a script line that does not parse; nothing runs.
var ErrScript = errors.New("qmp script")

// Script limits.
const (
	MaxScriptBytes   = 1 << 20
	MaxScriptActions = 10000
	MaxWait          = time.Minute
)

// Action is one parsed script line.
type Action struct {
	Line int    `json:"line"`
	Verb string `json:"action"`
	X, Y int    `json:"-"`
	N    int    `json:"-"` // scroll notches or wait milliseconds
	Text string `json:"-"` // key combo or text to type
}

// unsupportedVerbs name operations that must fail with ErrUnsupported
// rather than being misread as unknown or passed anywhere else.
var unsupportedVerbs = map[string]string{
	"exec": "exec", "run": "exec", "shell": "exec",
	"read": "read_file", "write": "write_file", "upload": "write_file", "download": "read_file",
	"clipboard": "clipboard", "copy": "clipboard", "paste": "clipboard",
	"browser": "browser", "open": "browser", "navigate": "browser",
}

// ParseScript parses a whole script before anything runs: one action per
// line (capture, move X Y, click X Y, dclick X Y, scroll DY, key COMBO,
// type TEXT, wait MS); blank lines and lines starting with '#' are
// skipped. Unsupported verbs parse (they fail with ErrUnsupported when
// run); anything else that does not parse fails with ErrScript.
func ParseScript(r io.Reader) ([]Action, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxScriptBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxScriptBytes {
		return nil, fmt.Errorf("%w: longer than %d bytes", ErrScript, MaxScriptBytes)
	}
	var out []Action
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 4096), 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		a, err := parseAction(n, line)
		if err != nil {
			return nil, err
		}
		if out = append(out, a); len(out) > MaxScriptActions {
			return nil, fmt.Errorf("%w: more than %d actions", ErrScript, MaxScriptActions)
		}
	}
	return out, sc.Err()
}

func parseAction(n int, line string) (Action, error) {
	verb, rest, _ := strings.Cut(strings.TrimLeft(line, " \t"), " ")
	a := Action{Line: n, Verb: verb}
	bad := func(why string) (Action, error) {
		return Action{}, fmt.Errorf("%w: line %d: %s: %s", ErrScript, n, verb, why)
	}
	fields := strings.Fields(rest)
	var err error
	switch verb {
	case "capture":
		if len(fields) != 0 {
			return bad("takes no argument")
		}
	case "move", "click", "dclick":
		if len(fields) != 2 {
			return bad("want X Y")
		}
		if a.X, err = strconv.Atoi(fields[0]); err == nil {
			a.Y, err = strconv.Atoi(fields[1])
		}
	case "scroll":
		if len(fields) != 1 {
			return bad("want DY")
		}
		a.N, err = strconv.Atoi(fields[0])
	case "wait":
		if len(fields) != 1 {
			return bad("want MS")
		}
		if a.N, err = strconv.Atoi(fields[0]); err == nil && (a.N < 0 || time.Duration(a.N)*time.Millisecond > MaxWait) {
			return bad(fmt.Sprintf("0..%d ms", MaxWait.Milliseconds()))
		}
	case "key":
		if len(fields) != 1 {
			return bad("want one combo such as ctrl+alt+t")
		}
		a.Text = fields[0]
	case "type":
		if rest == "" {
			return bad("want text")
		}
		a.Text = rest // verbatim, spaces included
	default:
		if _, ok := unsupportedVerbs[verb]; !ok {
			return bad("unknown action")
		}
	}
	if err != nil {
		return bad(err.Error())
	}
	return a, nil
}

// Result is the JSON line printed for one action.
type Result struct {
	Line    int    `json:"line"`
	Action  string `json:"action"`
	OK      bool   `json:"ok"`
	Skipped bool   `json:"skipped,omitempty"`
	Code    string `json:"code,omitempty"`  // ErrorCode of the failure
	Error   string `json:"error,omitempty"` // the failure, naming the failed check
	*Frame
}

// RunScript runs actions in order on a, writing one JSON line per action
// to w. Each action runs under its own deadline of perAction (none when
// perAction <= 0); an action that overruns it fails with ErrActionDeadline. The
// first failure stops the script: later actions are reported as skipped,
// never run in a state the script did not expect. It returns the number of
// actions that failed or were skipped. A failed write to w stops the
// script at once, so no action runs whose result cannot be reported, and
// is returned as the error.
func RunScript(ctx context.Context, a *Adapter, actions []Action, w io.Writer, perAction time.Duration) (int, error) {
	enc := json.NewEncoder(w)
	bad := 0
	for _, act := range actions {
		r := Result{Line: act.Line, Action: act.Verb}
		if bad > 0 {
			r.Skipped, r.Code, r.Error = true, "skipped", "not run: an earlier action failed"
		} else if f, err := a.doWithin(ctx, act, perAction); err != nil {
			r.Code, r.Error = ErrorCode(err), err.Error()
		} else {
			r.OK, r.Frame = true, f
		}
		if !r.OK {
			bad++
		}
		if err := enc.Encode(r); err != nil {
			return bad, fmt.Errorf("script output, line %d: %w", act.Line, err)
		}
	}
	return bad, nil
}

// doWithin runs act under a deadline of d (none when d <= 0) and names an
// overrun as ErrActionDeadline.
func (a *Adapter) doWithin(ctx context.Context, act Action, d time.Duration) (*Frame, error) {
	if d <= 0 {
		return a.Do(ctx, act)
	}
	actx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	f, err := a.Do(actx, act)
	if err != nil && ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("%w: line %d: %s did not finish within %s: %w", ErrActionDeadline, act.Line, act.Verb, d, err)
	}
	return f, err
}

// Do runs one action. A capture returns its frame.
func (a *Adapter) Do(ctx context.Context, act Action) (*Frame, error) {
	switch act.Verb {
	case "capture":
		f, err := a.Capture(ctx)
		if err != nil {
			return nil, err
		}
		return &f, nil
	case "move":
		return nil, a.Move(ctx, act.X, act.Y)
	case "click":
		return nil, a.Click(ctx, act.X, act.Y, ButtonLeft)
	case "dclick":
		return nil, a.DoubleClick(ctx, act.X, act.Y)
	case "scroll":
		return nil, a.Scroll(ctx, act.N)
	case "key":
		return nil, a.Key(ctx, act.Text)
	case "type":
		return nil, a.Type(ctx, act.Text)
	case "wait":
		return nil, backoff.Sleep(ctx, time.Duration(act.N)*time.Millisecond)
	}
	if op, ok := unsupportedVerbs[act.Verb]; ok {
		return nil, &UnsupportedError{Op: op}
	}
	return nil, fmt.Errorf("%w: unknown action %q", ErrScript, act.Verb)
}
