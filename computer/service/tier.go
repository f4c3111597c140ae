package service

import (
	"context"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/policy"
)

// tierOf resolves a create's tier: "" and api.TierNamespaced are the
// default provisioner's; any other must be a key of Config.Provisioners,
// else the request is refused (bad_request) and nothing is made.
func (s *Service) tierOf(t string) (string, error) {
	if t == "" || t == api.TierNamespaced {
		return api.TierNamespaced, nil
	}
	if _, ok := s.cfg.Provisioners[t]; ok {
		return t, nil
	}
	return "", api.Errorf(api.CodeBadRequest, "tier %q is not offered by this service (tiers: %v)", t, s.tiers())
}

// tiers lists the tiers this service offers.
func (s *Service) tiers() []string {
	out := []string{api.TierNamespaced}
	for t := range s.cfg.Provisioners {
		if t != api.TierNamespaced {
			out = append(out, t)
		}
	}
	return out
}

// provFor is the provisioner of tier; the default one for the default
// tier and for records written before tiers ("").
func (s *Service) provFor(tier string) api.Provisioner {
	if p, ok := s.cfg.Provisioners[tier]; ok && tier != api.TierNamespaced {
		return p
	}
	return s.prov
}

// tierName is a record's tier as the API says it.
func tierName(t string) string {
	if t == "" {
		return api.TierNamespaced
	}
	return t
}

// acceleratorOf is a machine's accelerator and transport, when it says
// them.
func acceleratorOf(m api.Machine) (accel, transport string) {
	if d, ok := m.(api.Described); ok {
		i := d.Describe()
		return i.Accelerator, i.Transport
	}
	return "", ""
}

// claimForLocked claims a warm machine for w: the pool holds machines of
// the default tier only.
func (s *Service) claimForLocked(w *waiter) api.Machine {
	if tierName(w.tier) != api.TierNamespaced {
		return nil
	}
	return s.claimLocked(w.limits)
}

// rootedTier refuses an import of files into a tier whose machines have
// no root the service reaches on the host (a VM computer's root is in
// its guest; its tier imports disks, diskTier), before anything is read
// or made.
func rootedTier(t string) error {
	if tierName(t) != api.TierNamespaced {
		return api.Errorf(api.CodeBadRequest, "import makes namespaced computers, or computers of a tier that imports disk exports, not tier %q", t)
	}
	return nil
}

// egressTiers are the tiers whose machines reach the egress proxy: a
// namespaced computer through a listener in its own network namespace,
// a VM computer through the streams its guest dials over its wire link
// (its guest has no network device).
var egressTiers = map[string]bool{api.TierNamespaced: true, api.TierVM: true}

// tierEgress refuses a policy that allows anything for a computer of a
// tier that cannot reach the egress proxy (none today but a tier the
// service does not know, which create refuses anyway).
func tierEgress(tier string, pol policy.Policy) error {
	if !egressTiers[tierName(tier)] && !denyAll(pol) {
		return api.Errorf(api.CodeBadRequest, "egress: a %s computer cannot reach the egress proxy; its policy must deny all", tier)
	}
	return nil
}

// attachEgressByTier attaches a computer of a tier that reaches the
// egress proxy; one of another tier has no network to attach (its
// policy denies all, tierEgress).
func (s *Service) attachEgressByTier(ctx context.Context, c *computer) error {
	if !egressTiers[tierName(c.rec.Tier)] {
		return nil
	}
	return s.attachEgress(ctx, c)
}
