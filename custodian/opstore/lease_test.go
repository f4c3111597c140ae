package opstore

import "testing"

// TestKeepForLeaseOutlivesTheExtendedLease dispatches a key under a 1 h
// lease, extends the tuple's lease to 72 h, and checks that neither the
// periodic retention (dispatch + 25 h) nor a reopen prunes the key until
// the extended lease plus the retention has passed. Another tuple's key
// is not kept by the extension.
func TestKeepForLeaseOutlivesTheExtendedLease(t *testing.T) {
	contractKeepForLease(t, bboltBackend)
}
