// Package ratelog bounds the log lines a flood of refused connections can
// cause. Refusals are counted per reason: the first of a window is logged
// at once with its details, the others only counted, and when the window
// ends one line gives their count and the last peer. However fast peers
// are refused, each reason costs at most two lines per window.
package ratelog

import (
	"log/slog"
	"sync"
	"time"
)

// DefaultWindow is the aggregation window when New is given none.
const DefaultWindow = 10 * time.Second

// Log aggregates refusals into a slog.Logger. It is safe for concurrent
// use; Close logs what is still counted and stops its timers.
type Log struct {
	log    *slog.Logger
	msg    string
	window time.Duration

	mu      sync.Mutex
	reasons map[string]*window
	closed  bool
}

// window is the current aggregation window of one reason.
type window struct {
	count    int64 // refusals after the first, not logged yet
	lastPeer string
	timer    *time.Timer
}

// New returns a Log writing msg lines to log (nil discards), aggregating
// over windows of every (<= 0 means DefaultWindow).
func New(log *slog.Logger, msg string, every time.Duration) *Log {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if every <= 0 {
		every = DefaultWindow
	}
	return &Log{log: log, msg: msg, window: every, reasons: map[string]*window{}}
}

// Refused records one refusal. reason must come from a small fixed set
// (it keys the count); peer and err are logged only for the first refusal
// of a window and peer for the last.
func (l *Log) Refused(reason, peer string, err error) {
	l.mu.Lock()
	if w := l.reasons[reason]; w != nil || l.closed {
		if w != nil {
			w.count++
			w.lastPeer = peer
		}
		l.mu.Unlock()
		return
	}
	w := &window{}
	l.reasons[reason] = w
	w.timer = time.AfterFunc(l.window, func() { l.end(reason, w) })
	l.mu.Unlock()
	attrs := []any{"reason", reason, "peer", peer}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	l.log.Warn(l.msg, attrs...)
}

// end closes reason's window w and logs what it counted.
func (l *Log) end(reason string, w *window) {
	l.mu.Lock()
	if l.reasons[reason] != w {
		l.mu.Unlock()
		return
	}
	delete(l.reasons, reason)
	n, peer := w.count, w.lastPeer
	l.mu.Unlock()
	l.summary(reason, n, peer)
}

func (l *Log) summary(reason string, n int64, peer string) {
	if n > 0 {
		l.log.Warn(l.msg+": more refused in the last window", "reason", reason, "count", n,
			"window", l.window.String(), "last_peer", peer)
	}
}

// Close logs the counts of the open windows and stops counting; later
// refusals are dropped silently. Safe to call twice.
func (l *Log) Close() {
	l.mu.Lock()
	open := l.reasons
	l.reasons, l.closed = map[string]*window{}, true
	l.mu.Unlock()
	for reason, w := range open {
		if w.timer.Stop() {
			l.summary(reason, w.count, w.lastPeer)
		}
	}
}
