package egress

import (
	"context"
	"errors"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/tetherdev/tether/egress/policy"
)

// refusalQueue bounds the refusals waiting for a computer's callback.
const refusalQueue = 256

// computer is one attached computer: its listener, policy, limits and
// open sessions.
type computer struct {
	p        *Proxy
	id       string
	ln       net.Listener
	pol      atomic.Pointer[policy.Compiled]
	lim      *rate.Limiter
	accepts  *rate.Limiter // new connections
	slots    chan struct{}
	ctx      context.Context
	cancel   context.CancelFunc
	refusals chan policy.Refusal
	refused  func(policy.Refusal)

	mu       sync.Mutex
	sessions map[*session]struct{}
	wg       sync.WaitGroup // the accept loop and every session
	refDone  chan struct{}

	open, up, down, total, nRefused, dropped atomic.Int64
}

func newComputer(p *Proxy, id string, ln net.Listener, pol *policy.Compiled, refused func(policy.Refusal)) *computer {
	c := &computer{p: p, id: id, ln: ln, refused: refused, sessions: map[*session]struct{}{},
		refusals: make(chan policy.Refusal, refusalQueue), refDone: make(chan struct{})}
	c.pol.Store(pol)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	lim := p.cfg.Limits
	if lim.Conns > 0 {
		c.slots = make(chan struct{}, lim.Conns)
	}
	c.accepts = rate.NewLimiter(rate.Inf, 0)
	if lim.AcceptsPerSecond > 0 {
		burst := lim.Conns
		if burst <= 0 {
			burst = DefaultConns
		}
		c.accepts = rate.NewLimiter(rate.Limit(lim.AcceptsPerSecond), burst)
	}
	c.lim = rate.NewLimiter(rate.Inf, 0)
	if lim.BytesPerSecond > 0 {
		burst := max(lim.BytesPerSecond/8, copyBuf)
		c.lim = rate.NewLimiter(rate.Limit(lim.BytesPerSecond), int(min(burst, math.MaxInt32)))
	}
	return c
}

// start runs the accept loop and the refusal callback's goroutine.
func (c *computer) start() {
	go c.deliverRefusals()
	c.wg.Add(1)
	go c.acceptLoop()
}

// stop closes the listener and every session, waits for them, then for
// the refusal callback. Called once, by Detach or Close.
func (c *computer) stop() {
	c.cancel()
	c.ln.Close()
	c.mu.Lock()
	for s := range c.sessions {
		s.close()
	}
	c.sessions = nil
	c.mu.Unlock()
	c.wg.Wait()
	close(c.refusals)
	<-c.refDone
}

func (c *computer) acceptLoop() {
	defer c.wg.Done()
	for {
		if err := c.accepts.Wait(c.ctx); err != nil {
			return // stopped
		}
		conn, err := c.ln.Accept()
		if err != nil {
			var ne net.Error
			if c.ctx.Err() == nil && errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		s := newSession(c, conn)
		if !c.register(s) {
			conn.Close()
			return
		}
		go c.serve(s)
	}
}

// register adds s to the open sessions; false once the computer stops.
func (c *computer) register(s *session) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sessions == nil {
		return false
	}
	c.sessions[s] = struct{}{}
	c.wg.Add(1)
	return true
}

func (c *computer) unregister(s *session) {
	c.mu.Lock()
	if c.sessions != nil {
		delete(c.sessions, s)
	}
	c.mu.Unlock()
	c.wg.Done()
}

// acquire takes a connection slot without waiting.
func (c *computer) acquire() bool {
	if c.slots != nil {
		select {
		case c.slots <- struct{}{}:
		default:
			return false
		}
	}
	c.open.Add(1)
	return true
}

func (c *computer) release() {
	c.open.Add(-1)
	if c.slots != nil {
		<-c.slots
	}
}

// setPolicy stores pol, then closes every open session pol no longer
// allows. A session that checks its destination concurrently sees pol
// (session.settle), so none slips between the two.
func (c *computer) setPolicy(pol *policy.Compiled) {
	c.pol.Store(pol)
	c.mu.Lock()
	open := make([]*session, 0, len(c.sessions))
	for s := range c.sessions {
		open = append(open, s)
	}
	c.mu.Unlock()
	for _, s := range open {
		s.recheck(pol)
	}
}

// report queues a refusal for the callback; it never blocks a session.
func (c *computer) report(r policy.Refusal) {
	c.nRefused.Add(1)
	if c.refused == nil {
		return
	}
	select {
	case c.refusals <- r:
	default:
		c.dropped.Add(1)
	}
}

// deliverRefusals calls the callback, one refusal at a time.
func (c *computer) deliverRefusals() {
	defer close(c.refDone)
	for r := range c.refusals {
		if c.refused != nil {
			c.refused(r)
		}
	}
}

func (c *computer) stats() Stats {
	return Stats{Open: c.open.Load(), BytesUp: c.up.Load(), BytesDown: c.down.Load(),
		Refused: c.nRefused.Load(), RefusalsDropped: c.dropped.Load()}
}

// now is the proxy's clock for records.
func now() time.Time { return time.Now().UTC() }
