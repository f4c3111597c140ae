package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/tetherdev/tether/admission/backoff"
)

// ErrWitnessURL: a witness URL is neither https nor http to a loopback
// host.
var ErrWitnessURL = errors.New("audit: witness URL")

// CheckWitnessURL accepts https URLs of a host, and plain http only to a
// loopback host (localhost, 127.0.0.0/8, ::1): the rule of the etcd
// endpoints of an op store. Cosignatures are verified whatever the
// transport; TLS keeps a network attacker from posing as a witness that
// is down and from reading which checkpoints are sent.
func CheckWitnessURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%w: %q is not the URL of a host (no user, query or fragment)", ErrWitnessURL, raw)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if ip := net.ParseIP(u.Hostname()); u.Hostname() == "localhost" || (ip != nil && ip.IsLoopback()) {
			return nil
		}
		return fmt.Errorf("%w: %q: plain http is only allowed to a loopback host", ErrWitnessURL, raw)
	}
	return fmt.Errorf("%w: %q: scheme must be https", ErrWitnessURL, raw)
}

// SubmitOptions configure a Submitter.
type SubmitOptions struct {
	// Witnesses receive every checkpoint; their URLs must pass
	// CheckWitnessURL and their keys must be distinct.
	Witnesses []Witness
	// Quorum is how many cosignatures a checkpoint needs before it
	// replaces CosignedFile; zero means all the witnesses.
	Quorum int
	// Logger receives the outcome of each checkpoint and each witness's
	// failure streaks; nil discards them.
	Logger *slog.Logger
	// HTTPClient sends the requests; nil means a client that follows no
	// redirect and gives each request RequestTimeout.
	HTTPClient *http.Client
	// RequestTimeout bounds one round with the witnesses. Zero means 10 s.
	RequestTimeout time.Duration
	// RetryMin and RetryMax bound the backoff of a failing witness: the
	// wait doubles from RetryMin up to RetryMax. Zero means 1 s and 1 min.
	RetryMin, RetryMax time.Duration
	// CloseTimeout bounds how long Close waits for the last checkpoint's
	// round. Zero means 10 s.
	CloseTimeout time.Duration
}

func (o *SubmitOptions) fill() {
	if o.Quorum == 0 {
		o.Quorum = len(o.Witnesses)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 10 * time.Second
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: o.RequestTimeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if o.RetryMin <= 0 {
		o.RetryMin = time.Second
	}
	if o.RetryMax <= 0 {
		o.RetryMax = time.Minute
	}
	o.RetryMax = max(o.RetryMax, o.RetryMin)
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = 10 * time.Second
	}
}

// validate names the first unusable setting.
func (o *SubmitOptions) validate() error {
	if len(o.Witnesses) == 0 || o.Quorum < 1 || o.Quorum > len(o.Witnesses) {
		return fmt.Errorf("%w: quorum %d of %d witnesses: want 1 to %d", ErrWitnessQuorum, o.Quorum, len(o.Witnesses), len(o.Witnesses))
	}
	seen := map[uint32]bool{}
	for _, w := range o.Witnesses {
		if w.Verifier == nil {
			return fmt.Errorf("%w: witness %s has no key", ErrWitnessKey, w.URL)
		}
		if err := CheckWitnessURL(w.URL); err != nil {
			return err
		}
		if seen[w.Verifier.KeyHash()] {
			return fmt.Errorf("%w: witness key %s given twice", ErrWitnessKey, w.Verifier.Name())
		}
		seen[w.Verifier.KeyHash()] = true
	}
	return nil
}

// Submitter sends each new checkpoint of one audit log to its witnesses
// in the background (CosignRound, the exchange of `tether-custodian
// audit witness`) and keeps their cosignatures in CosignedFile, where
// CheckWitnessed reads them. Notify never blocks; a round in progress
// never delays the log. A failing witness is retried with a doubling
// backoff and logged once per failure streak, by name; each checkpoint's
// outcome (quorum reached or not) is logged once. Whoever creates a
// Submitter closes it, after the Log whose OnCheckpoint calls Notify.
type Submitter struct {
	dir  string
	v    note.Verifier
	opts SubmitOptions

	kick   chan struct{} // one pending notification
	stop   chan struct{}
	done   chan struct{}
	cancel context.CancelFunc
	once   sync.Once

	// Only the loop goroutine touches these.
	streaks []streak
	logged  map[int64]bool // checkpoint sizes whose outcome was logged, and whether witnessed
}

// streak is one witness's current run of failures.
type streak struct {
	fails int
	next  time.Time // not asked again before
}

// NewSubmitter starts the submitter of the audit log in dir, whose
// checkpoints v verifies. Close stops it.
func NewSubmitter(dir string, v note.Verifier, opts SubmitOptions) (*Submitter, error) {
	opts.fill()
	opts.Witnesses = append([]Witness(nil), opts.Witnesses...)
	for i := range opts.Witnesses {
		opts.Witnesses[i].URL = strings.TrimSuffix(opts.Witnesses[i].URL, "/")
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Submitter{dir: dir, v: v, opts: opts, kick: make(chan struct{}, 1), stop: make(chan struct{}),
		done: make(chan struct{}), cancel: cancel, streaks: make([]streak, len(opts.Witnesses)), logged: map[int64]bool{}}
	go s.loop(ctx)
	return s, nil
}

// Notify tells the submitter a new checkpoint was written. It never
// blocks: notifications that arrive during a round are merged into one,
// and the next round reads the latest checkpoint. Its signature fits
// Options.OnCheckpoint.
func (s *Submitter) Notify(int64) {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Close submits a checkpoint notified and not yet sent (the log's final
// one, when the Log was closed first) to every witness, waiting at most
// CloseTimeout, then stops the submitter. Safe to call twice.
func (s *Submitter) Close() {
	s.once.Do(func() {
		close(s.stop)
		t := time.NewTimer(s.opts.CloseTimeout)
		defer t.Stop()
		select {
		case <-s.done:
		case <-t.C:
			s.opts.Logger.Error("audit witness: the last checkpoint's round did not end in time; abandoned",
				"close_timeout", s.opts.CloseTimeout)
		}
		s.cancel()
		<-s.done
	})
}

// loop runs a round at each notification and at each failing witness's
// retry time, until Close.
func (s *Submitter) loop(ctx context.Context) {
	defer close(s.done)
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	for {
		select {
		case <-s.stop:
			select {
			case <-s.kick:
				s.round(ctx, true)
			default:
			}
			return
		case <-s.kick:
		case <-retry.C:
		}
		if wait, ok := s.round(ctx, false); ok {
			retry.Reset(wait)
		}
	}
}

// round asks every witness not waiting out its backoff (all of them when
// final) and returns when the next retry is due, if a witness failed.
func (s *Submitter) round(ctx context.Context, final bool) (time.Duration, bool) {
	now := time.Now()
	var idx []int
	var ws []Witness
	for i, w := range s.opts.Witnesses {
		if final || !s.streaks[i].next.After(now) {
			idx, ws = append(idx, i), append(ws, w)
		}
	}
	if len(ws) == 0 { // every witness waits out its backoff; the retry sends the latest checkpoint
		return s.nextRetry(now)
	}
	rctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	res, err := CosignRound(rctx, s.dir, s.v, ws, s.opts.Quorum, s.opts.HTTPClient)
	cancel()
	if res.Errs == nil { // the checkpoint itself could not be read or checked
		s.opts.Logger.Error("audit witness: checkpoint not sent", "err", err)
		return 0, false
	}
	for j, i := range idx {
		s.record(i, res.Errs[j], now)
	}
	s.logOutcome(res, err)
	return s.nextRetry(now)
}

// record updates witness i's failure streak, logging its first failure
// and its recovery.
func (s *Submitter) record(i int, err error, now time.Time) {
	w, st := s.opts.Witnesses[i], &s.streaks[i]
	if err == nil {
		if st.fails > 0 {
			s.opts.Logger.Info("audit witness cosigns again", "witness", w.Verifier.Name(), "url", w.URL, "failed_rounds", st.fails)
		}
		*st = streak{}
		return
	}
	if st.fails == 0 {
		s.opts.Logger.Warn("audit witness failed; retrying with backoff, logged again only when it recovers",
			"witness", w.Verifier.Name(), "url", w.URL, "err", err)
	}
	st.fails++
	st.next = now.Add((&backoff.Backoff{Base: s.opts.RetryMin, Cap: s.opts.RetryMax}).Ceiling(st.fails - 1))
}

// logOutcome logs once per checkpoint size whether it reached the
// quorum, and again if a retry reaches it later.
func (s *Submitter) logOutcome(res CosignResult, err error) {
	witnessed, seen := s.logged[res.Size]
	switch {
	case res.Written && (!seen || !witnessed):
		s.opts.Logger.Info("audit checkpoint witnessed", "size", res.Size, "cosigned", strings.Join(res.Cosigned, ","),
			"quorum", s.opts.Quorum, "witnesses", len(s.opts.Witnesses))
	case !res.Written && !seen:
		s.opts.Logger.Error("audit checkpoint not witnessed: quorum not reached", "size", res.Size,
			"cosigned", len(res.Cosigned), "quorum", s.opts.Quorum, "witnesses", len(s.opts.Witnesses), "err", err)
	default:
		return
	}
	if len(s.logged) > 1024 { // a bound, not a history: only recent sizes are retried
		clear(s.logged)
	}
	s.logged[res.Size] = res.Written
}

// nextRetry returns the wait until the earliest failing witness is due.
func (s *Submitter) nextRetry(now time.Time) (time.Duration, bool) {
	var first time.Time
	for _, st := range s.streaks {
		if st.fails > 0 && (first.IsZero() || st.next.Before(first)) {
			first = st.next
		}
	}
	if first.IsZero() {
		return 0, false
	}
	return max(first.Sub(now), 0), true
}
