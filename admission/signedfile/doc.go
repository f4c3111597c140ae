// Package signedfile is the signed admission file: the Publisher that
// writes it (DSSE, one generation after another, under a directory lock and
// an optional leader fence), the Loader that trusts it only after every
// check (no symlink, owner, mode, size, signature, schema, expiry, no
// rollback) and the Refresher that keeps a receiver's view of it current.
// The documents it carries are admission's; docs/admission.md is the
// reference.
package signedfile
