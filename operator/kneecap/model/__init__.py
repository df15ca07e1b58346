"""Pure performance and queueing models: arrays in, arrays out; no I/O, no Kubernetes."""
