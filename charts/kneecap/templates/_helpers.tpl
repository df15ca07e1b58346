{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "kneecap.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects. */}}
{{- define "kneecap.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kneecap.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the release. */}}
{{- define "kneecap.labels" -}}
helm.sh/chart: {{ include "kneecap.chart" . }}
{{ include "kneecap.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kneecap
{{- end }}

{{/* Labels that select the operator pod. */}}
{{- define "kneecap.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kneecap.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "kneecap.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kneecap.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kneecap.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Alert rules: files/alerts.yaml (a plain Prometheus rule file, tested by promtool) with the
runbook base URL substituted. Both the PrometheusRule and the Grafana provisioning render from
this, so they cannot drift.
*/}}
{{- define "kneecap.alertRules" -}}
{{- .Files.Get "files/alerts.yaml" | replace "https://github.com/kneecap/kneecap/blob/main/docs/operations.md" .Values.alerts.runbookBaseUrl }}
{{- end }}

{{/*
Whether to render a prometheus-operator object: (list <enabled value> <root context> <Kind>).
enabled "auto" renders it only when the cluster serves monitoring.coreos.com/v1 <Kind> (Helm's
capabilities list both "group/version" and "group/version/Kind"; `helm template` knows only what
--api-versions names, so `--api-versions monitoring.coreos.com/v1` turns them on there); true
renders it always (the install then fails without the CRD); false never. Prints "true" or nothing.
*/}}
{{- define "kneecap.monitoringObject" -}}
{{- $enabled := index . 0 }}
{{- $api := (index . 1).Capabilities.APIVersions }}
{{- $kind := index . 2 }}
{{- if eq (toString $enabled) "auto" }}
{{- if or ($api.Has (printf "monitoring.coreos.com/v1/%s" $kind)) ($api.Has "monitoring.coreos.com/v1") }}true{{ end }}
{{- else if $enabled }}true{{ end }}
{{- end }}
