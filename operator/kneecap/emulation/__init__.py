"""What kube-apiserver and a cluster's controllers do, emulated for `kneecap demo` and virtual
time (`kneecap replay`, :mod:`kneecap.sim.cluster`): the admission rules a write goes through
(:mod:`~kneecap.emulation.admission`), JSON merge patch (:mod:`~kneecap.emulation.merge_patch`),
an in-memory store with the API's verbs and garbage collector (:mod:`~kneecap.emulation.store`),
the Deployment and ReplicaSet controllers (:mod:`~kneecap.emulation.controllers`) and what they
write (:mod:`~kneecap.emulation.workloads`), the kubelet that runs their pods on a node
(:mod:`~kneecap.emulation.kubelet`), and the demo's HTTP front end to the store
(:mod:`~kneecap.emulation.kubeapi`, on kmock: the `demo` extra).

The operator (`kneecap run`, :mod:`kneecap.control`, :mod:`kneecap.model`, :mod:`kneecap.observe`)
never imports it (tests/unit/test_emulation_imports.py); only the HTTP front end imports kmock,
so the plain install's `kneecap replay` can use the rest.
"""
