// Package nativesuite is CI suite (b), the native client computer: the
// chain's end-to-end pipeline (fixtures/e2e.RunPipeline) with the host
// agent, the plugin and the custodian on the host and the receiver inside
// a QEMU guest (fixtures/vmcomputer), plus the admission share's
// request-time refresh with zero inotify events. Its tests carry the
// build tag "vmsuite": ci/vm-receipts runs them (and writes the suite's
// receipt), so `make test` does not boot them a second time.
package nativesuite
