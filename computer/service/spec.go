package service

import (
	"strings"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/policy"
)

// spec is a create request checked and with defaults applied.
type spec struct {
	limits       api.Limits
	ttl          time.Duration
	idle         time.Duration
	queueTimeout time.Duration
	labels       map[string]string
	tier         string
	egress       policy.Policy
	screen       bool
}

// check validates req; every refusal is bad_request and nothing is made.
func (s *Service) check(req api.CreateRequest) (spec, error) {
	l := withDefaults(req.Limits, s.cfg.DefaultLimits)
	if err := s.checkLimits(l); err != nil {
		return spec{}, err
	}
	ttl, err := s.leaseTTL(req.LeaseTTLSeconds)
	if err != nil {
		return spec{}, err
	}
	idle, err := seconds("idle_timeout_s", req.IdleTimeoutSeconds, s.cfg.IdleTimeout, 0)
	if err != nil {
		return spec{}, err
	}
	qt, err := seconds("queue_timeout_s", req.QueueTimeoutSeconds, s.cfg.QueueTimeout, MaxQueueTimeout)
	if err != nil {
		return spec{}, err
	}
	if err := checkLabels(req.Labels); err != nil {
		return spec{}, err
	}
	tier, err := s.tierOf(req.Tier)
	if err != nil {
		return spec{}, err
	}
	if err := s.checkEgress(req.Egress); err != nil {
		return spec{}, err
	}
	if err := tierEgress(tier, req.Egress); err != nil {
		return spec{}, err
	}
	if err := s.tierScreen(tier, req.Screen); err != nil {
		return spec{}, err
	}
	return spec{limits: l, ttl: ttl, idle: idle, queueTimeout: qt, labels: req.Labels, tier: tier, egress: req.Egress,
		screen: req.Screen}, nil
}

// leaseTTL is the lease a create or renew asks for: zero means the
// default, more than the maximum is refused.
func (s *Service) leaseTTL(sec int64) (time.Duration, error) {
	return seconds("lease_ttl_s", sec, s.cfg.DefaultLeaseTTL, s.cfg.MaxLeaseTTL)
}

// seconds turns a request's seconds into a duration: negative refused,
// zero the default, over max (when max > 0) refused.
func seconds(name string, sec int64, def, max time.Duration) (time.Duration, error) {
	switch {
	case sec < 0:
		return 0, api.Errorf(api.CodeBadRequest, "%s is negative", name)
	case sec == 0:
		return def, nil
	case max > 0 && sec > int64(max/time.Second):
		return 0, api.Errorf(api.CodeBadRequest, "%s %d is over the maximum %d", name, sec, int64(max/time.Second))
	case sec > int64(100*365*24*time.Hour/time.Second):
		return 0, api.Errorf(api.CodeBadRequest, "%s %d is out of range", name, sec)
	}
	return time.Duration(sec) * time.Second, nil
}

func (s *Service) checkLimits(l api.Limits) error {
	for _, f := range []struct {
		name     string
		v, max   int64
		capacity int64
	}{
		{"limits.memory_bytes", l.MemoryBytes, s.cfg.MaxLimits.MemoryBytes, s.cfg.MaxMemoryBytes},
		{"limits.pids", l.Pids, s.cfg.MaxLimits.Pids, 0},
		{"limits.disk_bytes", l.DiskBytes, s.cfg.MaxLimits.DiskBytes, 0},
	} {
		if f.v < 0 {
			return api.Errorf(api.CodeBadRequest, "%s is negative", f.name)
		}
		if f.max > 0 && f.v > f.max {
			return api.Errorf(api.CodeBadRequest, "%s %d is over the maximum %d", f.name, f.v, f.max)
		}
		if f.capacity > 0 && f.v > f.capacity {
			return api.Errorf(api.CodeBadRequest, "%s %d is over the host's capacity %d", f.name, f.v, f.capacity)
		}
	}
	return nil
}

func checkLabels(labels map[string]string) error {
	if len(labels) > maxLabels {
		return api.Errorf(api.CodeBadRequest, "more than %d labels", maxLabels)
	}
	for k, v := range labels {
		if k == "" || len(k) > maxLabelKey || len(v) > maxLabelValue || strings.ContainsAny(k+v, "\x00\n") {
			return api.Errorf(api.CodeBadRequest, "label %.64q: keys 1-%d bytes, values up to %d, no NUL or newline",
				k, maxLabelKey, maxLabelValue)
		}
	}
	return nil
}
