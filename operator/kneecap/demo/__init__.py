"""The embedded cluster: an in-process Kubernetes API, a node (the emulations' kubelet) that runs
`kneecap twin` pods, a Service-like router, Poisson load and the real operator, for `kneecap demo`, the
closed-loop benchmarks and integration tests."""
