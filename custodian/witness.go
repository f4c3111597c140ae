package custodian

import (
	"fmt"
	"path/filepath"

	"golang.org/x/mod/sumdb/note"

	"github.com/tetherdev/tether/custodian/audit"
)

// WitnessConfig is one entry of the config's "witnesses": where a
// witness listens (https, or http to a loopback host) and its
// cosignature verifier key (name+hash+base64, as tether-witness prints
// it).
type WitnessConfig struct {
	URL  string `json:"url"`
	VKey string `json:"vkey"`
}

// WitnessOptions returns the submitter options of the config's
// witnesses (Options.Witness), or nil when it names none. The logger is
// left to the caller.
func (c *Config) WitnessOptions() (*audit.SubmitOptions, error) {
	if len(c.Witnesses) == 0 {
		if c.WitnessQuorum != 0 {
			return nil, fmt.Errorf("%w: witness_quorum without witnesses", ErrConfig)
		}
		return nil, nil
	}
	o := &audit.SubmitOptions{Quorum: c.WitnessQuorum}
	for i, w := range c.Witnesses {
		v, err := audit.LoadWitnessKey(w.VKey)
		if err != nil {
			return nil, fmt.Errorf("%w: witnesses[%d]: vkey: %w", ErrConfig, i, err)
		}
		if err := audit.CheckWitnessURL(w.URL); err != nil {
			return nil, fmt.Errorf("%w: witnesses[%d]: %w", ErrConfig, i, err)
		}
		o.Witnesses = append(o.Witnesses, audit.Witness{URL: w.URL, Verifier: v})
	}
	if err := validateWitnessQuorum(o); err != nil {
		return nil, err
	}
	return o, nil
}

// validateWitnessQuorum checks the quorum and that no key repeats (the
// quorum counts distinct witnesses).
func validateWitnessQuorum(o *audit.SubmitOptions) error {
	if o.Quorum < 0 || o.Quorum > len(o.Witnesses) {
		return fmt.Errorf("%w: witness_quorum %d: want 1 to %d (0: all)", ErrConfig, o.Quorum, len(o.Witnesses))
	}
	seen := map[uint32]int{}
	for i, w := range o.Witnesses {
		if j, dup := seen[w.Verifier.KeyHash()]; dup {
			return fmt.Errorf("%w: witnesses[%d] has the key of witnesses[%d]", ErrConfig, i, j)
		}
		seen[w.Verifier.KeyHash()] = i
	}
	return nil
}

// startWitnessing starts the submitter of Options.Witness, if set, and
// hooks it to the audit log's checkpoints. The caller closes it after
// the log.
func startWitnessing(opts Options, v note.Verifier, aopts *audit.Options) (*audit.Submitter, error) {
	if opts.Witness == nil {
		return nil, nil
	}
	wo := *opts.Witness
	if wo.Logger == nil {
		wo.Logger = opts.Logger
	}
	s, err := audit.NewSubmitter(filepath.Join(opts.StateDir, AuditDir), v, wo)
	if err != nil {
		return nil, fmt.Errorf("%w: witnesses: %w", ErrConfig, err)
	}
	aopts.OnCheckpoint = s.Notify
	return s, nil
}
