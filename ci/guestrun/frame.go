package guestrun

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
)

// Kind is one member of the closed set of report frames.
type Kind string

// The report is: one hello, then for each step in plan order a start, its
// output frames and an exit, then one done. Nothing may follow done.
const (
	KindHello  Kind = "hello"  // Release, Steps
	KindStart  Kind = "start"  // Step
	KindOutput Kind = "output" // Step, Data
	KindExit   Kind = "exit"   // Step, Exit
	KindDone   Kind = "done"
)

// Frame limits. A frame is one line of JSON; output travels in chunks.
const (
	MaxChunk      = 32 << 10 // bytes of output per frame
	maxFrameLine  = 64 << 10 // a chunk base64-encoded plus the envelope
	MaxStepOutput = 64 << 20 // output kept per step; more is a protocol violation
)

// stepOutputLimit is MaxStepOutput; tests lower it.
var stepOutputLimit = MaxStepOutput

// Frame is one line of the report.
type Frame struct {
	Kind    Kind      `json:"kind"`
	Step    int       `json:"step"`
	Time    time.Time `json:"time"`
	Release string    `json:"release,omitempty"` // hello: the guest's uname release
	Steps   int       `json:"steps,omitempty"`   // hello: how many steps the guest will run
	Data    []byte    `json:"data,omitempty"`    // output: raw bytes (base64 in JSON)
	Exit    *Exit     `json:"exit,omitempty"`    // exit
}

// Exit is how a step ended.
type Exit struct {
	Code     int     `json:"code"`                // exit status; -1 if signalled or never started
	Signal   string  `json:"signal,omitempty"`    // the signal that ended it
	TimedOut bool    `json:"timed_out,omitempty"` // the guest killed it at its timeout
	Error    string  `json:"error,omitempty"`     // why it could not be started or waited for
	ElapsedS float64 `json:"elapsed_s"`
}

// OK reports whether the step exited 0 on its own.
func (e *Exit) OK() bool {
	return e != nil && e.Code == 0 && e.Signal == "" && !e.TimedOut && e.Error == ""
}

func (e *Exit) String() string {
	switch {
	case e == nil:
		return "no exit reported"
	case e.Error != "":
		return "not run: " + e.Error
	case e.TimedOut:
		return fmt.Sprintf("killed at its timeout after %.1fs", e.ElapsedS)
	case e.Signal != "":
		return fmt.Sprintf("killed by %s after %.1fs", e.Signal, e.ElapsedS)
	}
	return fmt.Sprintf("exit %d after %.1fs", e.Code, e.ElapsedS)
}

// Writer writes frames to the port. It is safe for concurrent use.
type Writer struct {
	mu  sync.Mutex
	w   io.Writer
	now func() time.Time
}

// NewWriter writes frames to w; the caller owns w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w, now: time.Now} }

// Write encodes f as one line, stamping its time.
func (w *Writer) Write(f Frame) error {
	f.Time = w.now().UTC()
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err = w.w.Write(append(b, '\n'))
	return err
}

// Output writes p as output frames of step, at most MaxChunk bytes each.
func (w *Writer) Output(step int, p []byte) error {
	for len(p) > 0 {
		n := min(len(p), MaxChunk)
		if err := w.Write(Frame{Kind: KindOutput, Step: step, Data: p[:n]}); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// ErrStream wraps every protocol violation found in a report.
var ErrStream = errors.New("guest report")

// Transcript is what a report said, as far as it got.
type Transcript struct {
	Release string       // from hello ("" if hello never arrived)
	Hello   bool         // hello arrived
	Steps   []StepResult // one per plan step, in order
	Done    bool         // done arrived: the guest finished every step
}

// StepResult is one step as reported.
type StepResult struct {
	Started bool
	Start   time.Time
	Output  []byte
	Exit    *Exit // nil if the step never reported its exit
	End     time.Time
}

// Decode reads a report of a plan with steps steps. It returns what
// arrived even on error; a report that simply stops (a guest that crashed
// or never booted) is not an error: Done is false. Any frame out of order,
// malformed or oversized is an error wrapping ErrStream.
func Decode(r io.Reader, steps int) (*Transcript, error) {
	t := &Transcript{Steps: make([]StepResult, steps)}
	d := decoder{t: t, cur: -1}
	br := bufio.NewReaderSize(r, 64<<10)
	for n := 1; ; n++ {
		line, err := readLine(br)
		if errors.Is(err, io.EOF) {
			return t, nil
		}
		if err != nil {
			return t, fmt.Errorf("%w: line %d: %w", ErrStream, n, err)
		}
		var f Frame
		if err := strictjson.Decode(line, maxFrameLine, &f); err != nil {
			return t, fmt.Errorf("%w: line %d: %w", ErrStream, n, err)
		}
		if err := d.apply(f); err != nil {
			return t, fmt.Errorf("%w: line %d (%s): %w", ErrStream, n, f.Kind, err)
		}
	}
}

// readLine returns one newline-terminated line without its newline. A
// final line without a newline is a truncated frame and is dropped (the
// guest stopped mid-write): io.EOF.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxFrameLine {
			return nil, fmt.Errorf("frame longer than %d bytes", maxFrameLine)
		}
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}

type decoder struct {
	t   *Transcript
	cur int // the step whose start arrived and whose exit has not
}

func (d *decoder) apply(f Frame) error {
	t := d.t
	if t.Done {
		return errors.New("frame after done")
	}
	if !t.Hello && f.Kind != KindHello {
		return errors.New("first frame is not hello")
	}
	switch f.Kind {
	case KindHello:
		return d.hello(f)
	case KindStart:
		return d.start(f)
	case KindOutput:
		return d.output(f)
	case KindExit:
		return d.exit(f)
	case KindDone:
		if d.cur != -1 || (len(t.Steps) > 0 && t.Steps[len(t.Steps)-1].Exit == nil) {
			return errors.New("done before every step exited")
		}
		t.Done = true
		return nil
	}
	return fmt.Errorf("unknown frame kind %q", f.Kind)
}

func (d *decoder) hello(f Frame) error {
	if d.t.Hello {
		return errors.New("second hello")
	}
	if f.Steps != len(d.t.Steps) {
		return fmt.Errorf("guest plans %d steps, the host %d", f.Steps, len(d.t.Steps))
	}
	if f.Release == "" {
		return errors.New("hello without a kernel release")
	}
	d.t.Hello, d.t.Release = true, f.Release
	return nil
}

func (d *decoder) start(f Frame) error {
	next := 0
	for next < len(d.t.Steps) && d.t.Steps[next].Started {
		next++
	}
	if d.cur != -1 || f.Step != next || next >= len(d.t.Steps) {
		return fmt.Errorf("start of step %d out of order", f.Step)
	}
	d.cur = f.Step
	d.t.Steps[f.Step].Started, d.t.Steps[f.Step].Start = true, f.Time
	return nil
}

func (d *decoder) output(f Frame) error {
	if f.Step != d.cur || d.cur == -1 {
		return fmt.Errorf("output of step %d, which is not running", f.Step)
	}
	s := &d.t.Steps[f.Step]
	if len(s.Output)+len(f.Data) > stepOutputLimit {
		return fmt.Errorf("step %d output exceeds %d bytes", f.Step, stepOutputLimit)
	}
	s.Output = append(s.Output, f.Data...)
	return nil
}

func (d *decoder) exit(f Frame) error {
	if f.Step != d.cur || d.cur == -1 {
		return fmt.Errorf("exit of step %d, which is not running", f.Step)
	}
	if f.Exit == nil {
		return errors.New("exit frame without exit")
	}
	s := &d.t.Steps[f.Step]
	s.Exit, s.End = f.Exit, f.Time
	d.cur = -1
	return nil
}
