package qmpinput

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/tetherdev/tether/admission/strictjson"
)

// The closed set of QMP commands the adapter can send. qmp_capabilities
// is allowed exactly once, during the handshake; the others only after it.
// stop and cont freeze and unfreeze the VM for the live view's Pause and
// Resume (Adapter.Pause, Adapter.Resume); no script verb reaches them.
const (
	cmdCapabilities = "qmp_capabilities"
	cmdScreendump   = "screendump"
	cmdInputSend    = "input-send-event"
	cmdStop         = "stop"
	cmdCont         = "cont"
)

// AllowedCommands lists the closed command set, for documentation and tests.
var AllowedCommands = []string{cmdCapabilities, cmdScreendump, cmdInputSend, cmdStop, cmdCont}

// afterHandshake is the set allowed once capabilities are negotiated.
var afterHandshake = map[string]bool{cmdScreendump: true, cmdInputSend: true, cmdStop: true, cmdCont: true}

// Transport limits.
const (
	maxLine        = 1 << 20 // bytes in one QMP line
	eventBuffer    = 64      // events kept for a slow reader; later ones are dropped
	defaultTimeout = 10 * time.Second
)

// conn is one negotiated QMP connection. It implements go-qemu's
// qmp.Monitor so go-qemu's generated commands (raw.Monitor) run through it,
// but unlike go-qemu's SocketMonitor every call carries a ctx and a
// deadline, error classes are kept, replies are paired by id, and events
// never block replies: a reader goroutine hands replies to the waiting call
// and drops events that no one reads.
type conn struct {
	c       *net.UnixConn
	sem     chan struct{} // one command in flight
	replies chan Message  // capacity 1; only the in-flight call receives
	events  chan qmp.Event
	dropped atomic.Uint64
	nextID  atomic.Uint64
	ready   atomic.Bool // qmp_capabilities done

	greeting Greeting
	readDone chan struct{}
	mu       sync.Mutex
	err      error // first fatal error; set once
}

var _ qmp.Monitor = (*boundMonitor)(nil)

// handshake reads the greeting, checks the version against vr, negotiates
// capabilities through go-qemu (raw.Monitor.QMPCapabilities, which enables
// no optional capability) and starts the reader.
func handshake(ctx context.Context, uc *net.UnixConn, vr VersionRange) (*conn, error) {
	c := &conn{c: uc, sem: make(chan struct{}, 1), replies: make(chan Message, 1),
		events: make(chan qmp.Event, eventBuffer), readDone: make(chan struct{})}
	br := bufio.NewReaderSize(uc, 64<<10)
	stop := c.armDeadline(ctx)
	line, err := readLine(br)
	stop()
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	if c.greeting, err = DecodeGreeting(line); err != nil {
		uc.Close()
		return nil, err
	}
	if !vr.Contains(c.greeting.Version) {
		uc.Close()
		return nil, &VersionError{Got: c.greeting.Version, Range: vr}
	}
	go c.readLoop(br)
	if err := raw.NewMonitor(c.bind(ctx)).QMPCapabilities(); err != nil {
		c.close(err)
		return nil, fmt.Errorf("qmp capabilities negotiation: %w", err)
	}
	c.ready.Store(true)
	return c, nil
}

// armDeadline applies ctx's deadline (or the default) to the socket and
// returns a function that clears it.
func (c *conn) armDeadline(ctx context.Context) func() {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(defaultTimeout)
	}
	c.c.SetReadDeadline(dl)
	return func() { c.c.SetReadDeadline(time.Time{}) }
}

// readLine reads one '\n'-terminated line of at most maxLine bytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxLine {
			return nil, fmt.Errorf("%w: line longer than %d bytes", ErrProtocol, maxLine)
		}
		if err == nil {
			return line, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

// readLoop hands replies to the in-flight call and events to the bounded
// event buffer; it never blocks on either. Any violation closes the conn.
func (c *conn) readLoop(br *bufio.Reader) {
	defer close(c.readDone)
	for {
		line, err := readLine(br)
		if err != nil {
			c.close(fmt.Errorf("qmp read: %w", err))
			return
		}
		m, err := DecodeMessage(line)
		if err != nil {
			c.close(err)
			return
		}
		if m.IsEvent() {
			c.deliverEvent(line)
			continue
		}
		select {
		case c.replies <- m:
		default:
			c.close(fmt.Errorf("%w: reply while no command is in flight", ErrProtocol))
			return
		}
	}
}

func (c *conn) deliverEvent(line []byte) {
	var e qmp.Event
	if json.Unmarshal(line, &e) != nil {
		return
	}
	select {
	case c.events <- e:
	default:
		c.dropped.Add(1)
	}
}

// close records the first fatal error and closes the socket. Safe to call
// more than once and from any goroutine.
func (c *conn) close(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
		c.c.Close()
	}
	c.mu.Unlock()
}

func (c *conn) fatal() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// shutdown closes the connection and joins the reader.
func (c *conn) shutdown() {
	c.close(ErrClosed)
	<-c.readDone
}

// run sends one command of the closed set and waits for its reply, at most
// until ctx's deadline (or the default timeout). On timeout the connection
// is closed: a late reply could otherwise be paired with the next command.
func (c *conn) run(ctx context.Context, command []byte) ([]byte, error) {
	name, args, err := c.admit(command)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, defaultTimeout) // no-op if ctx ends sooner
	defer cancel()
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: waiting for the connection: %w", ErrDeadline, ctx.Err())
	}
	defer func() { <-c.sem }()
	if err := c.fatal(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrClosed, err)
	}
	id := c.nextID.Add(1)
	if err := c.write(ctx, name, args, id); err != nil {
		return nil, err
	}
	select {
	case m := <-c.replies:
		return c.reply(name, id, m)
	case <-c.readDone:
		return nil, fmt.Errorf("%w: %w", ErrClosed, c.fatal())
	case <-ctx.Done():
		c.close(fmt.Errorf("%w: %s", ErrDeadline, name))
		return nil, fmt.Errorf("%w: %s: %w (connection closed)", ErrDeadline, name, ctx.Err())
	}
}

// admit decodes a command and checks it against the closed set and the
// handshake state.
func (c *conn) admit(command []byte) (string, json.RawMessage, error) {
	var cmd struct {
		Execute   string          `json:"execute"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := strictjson.Decode(command, maxLine, &cmd); err != nil {
		return "", nil, fmt.Errorf("%w: malformed command: %w", ErrCommandNotAllowed, err)
	}
	switch {
	case cmd.Execute == cmdCapabilities && !c.ready.Load():
	case afterHandshake[cmd.Execute] && c.ready.Load():
	default:
		return "", nil, fmt.Errorf("%w: %q (closed set: %v)", ErrCommandNotAllowed, cmd.Execute, AllowedCommands)
	}
	return cmd.Execute, cmd.Arguments, nil
}

func (c *conn) write(ctx context.Context, name string, args json.RawMessage, id uint64) error {
	b, err := json.Marshal(struct {
		Execute   string          `json:"execute"`
		Arguments json.RawMessage `json:"arguments,omitempty"`
		ID        uint64          `json:"id"`
	}{name, args, id})
	if err != nil {
		return err
	}
	dl, _ := ctx.Deadline()
	c.c.SetWriteDeadline(dl)
	if _, err := c.c.Write(append(b, '\n')); err != nil {
		c.close(err)
		return fmt.Errorf("qmp write %s: %w", name, err)
	}
	return nil
}

func (c *conn) reply(name string, id uint64, m Message) ([]byte, error) {
	if !m.HasID || m.ID != id {
		err := fmt.Errorf("%w: reply id %d (has id %v) to command id %d", ErrProtocol, m.ID, m.HasID, id)
		c.close(err)
		return nil, err
	}
	if m.Error != nil {
		e := *m.Error
		e.Command = name
		return nil, &e
	}
	return m.Return, nil
}

// bind returns a qmp.Monitor whose Run uses ctx, so go-qemu's generated
// commands (which take no context) still carry a deadline.
func (c *conn) bind(ctx context.Context) *boundMonitor { return &boundMonitor{c: c, ctx: ctx} }

// boundMonitor adapts conn to go-qemu's qmp.Monitor for one ctx.
type boundMonitor struct {
	c   *conn
	ctx context.Context
}

// Connect is a no-op: the connection is negotiated by handshake.
func (b *boundMonitor) Connect() error { return nil }

// Disconnect closes the whole connection.
func (b *boundMonitor) Disconnect() error { b.c.shutdown(); return nil }

// Run sends command with the bound ctx; see conn.run.
func (b *boundMonitor) Run(command []byte) ([]byte, error) { return b.c.run(b.ctx, command) }

// Events returns the bounded event channel. A reader that falls behind
// loses events (counted by conn.dropped); it never delays a reply.
func (b *boundMonitor) Events(context.Context) (<-chan qmp.Event, error) { return b.c.events, nil }

var _ io.Closer = (*net.UnixConn)(nil)
