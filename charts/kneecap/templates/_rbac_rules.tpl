{{/*
Rules for the namespaced resources the operator reads and writes (used by the ClusterRole in
cluster-wide mode and by one Role per namespace in namespaced mode). Exactly the requests the
operator makes: tests/kube/test_rbac.py checks them against the audit log of a real apiserver.
*/}}
{{- define "kneecap.namespacedRules" -}}
# The custom resource: kopf lists and watches it and patches finalizers/progress annotations;
# the control loop patches status.
- apiGroups: [kneecap.io]
  resources: [llmdeployments]
  verbs: [list, watch, patch]
- apiGroups: [kneecap.io]
  resources: [llmdeployments/status]
  verbs: [patch]
# Owned objects carry an ownerReference with blockOwnerDeletion: where the
# OwnerReferencesPermissionEnforcement admission plugin is on, that needs update on finalizers.
- apiGroups: [kneecap.io]
  resources: [llmdeployments/finalizers]
  verbs: [update]
# kopf posts an Event per handler outcome; the operator one per decision.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# The vLLM pools the operator owns: read back (the control loop from a watch-backed cache),
# created, patched (spec changes and enforced decisions), deleted when the topology drops a pool.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, create, patch, delete]
# Ready vLLM pods to scrape (pod IPs and the kneecap.io/metrics-url annotation), watched; only
# the pods of a pool's own ReplicaSets (pod -> ReplicaSet -> Deployment by ownerReference).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [list, watch]
# The model's config.json when spec.model.configMapRef names a ConfigMap (read on spec changes).
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get]
# An HPA that targets a pool owns its replicas; the operator then only recommends them.
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [list, watch]
{{- end }}
