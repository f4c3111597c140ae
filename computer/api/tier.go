package api

// MachineInfo says what kind of machine is behind a computer.
type MachineInfo struct {
	// Tier is TierNamespaced or TierVM.
	Tier string
	// Accelerator is "kvm" or "tcg" for a VM computer, "" otherwise.
	Accelerator string
	// Transport names the channel between the host and the receiver,
	// and why it was chosen, e.g. "virtio-serial (--vm-transport serial)".
	Transport string
}

// Described is implemented by machines that say what they are; the
// service copies it into the computer's answer. A Machine that is not
// Described is of the tier its provisioner was chosen for.
type Described interface {
	Describe() MachineInfo
}
