{{/*
Rules for the namespaced resources the operator reads and writes (used by the ClusterRole in
cluster-wide mode and by one Role per namespace in namespaced mode).
*/}}
{{- define "kneecap.namespacedRules" -}}
# The custom resource: kopf watches it, patches finalizers/annotations, the operator patches status.
- apiGroups: [kneecap.io]
  resources: [llmdeployments]
  verbs: [get, list, watch, patch]
- apiGroups: [kneecap.io]
  resources: [llmdeployments/status]
  verbs: [get, patch]
# kopf posts an Event per handler outcome; the operator one per decision.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# The vLLM pools the operator owns.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, delete]
# Ready vLLM pods to scrape (pod IPs and the kneecap.io/metrics-url annotation).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
{{- end }}
