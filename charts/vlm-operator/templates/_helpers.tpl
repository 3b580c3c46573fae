{{/* Names and labels shared by every template. */}}

{{- define "vlm-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vlm-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "vlm-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vlm-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vlm-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "vlm-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vlm-operator
{{- end -}}

{{- define "vlm-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "vlm-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "vlm-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
Rules for the namespaced resources the operator reads and writes. Bound cluster-wide (ClusterRole)
when watchNamespaces is empty, else by a Role in each watched namespace. Derived from
vlm_operator/apply.py (server-side apply: create+patch; canary teardown: delete) and handlers.py
(kopf watches and indexes: list+watch; progress annotations: patch; Events: create).
*/}}
{{- define "vlm-operator.namespacedRules" -}}
- apiGroups: [serving.vlmops.dev]
  resources: [vlmservices]
  verbs: [get, list, watch, patch]
- apiGroups: [serving.vlmops.dev]
  resources: [vlmservices/status]
  verbs: [get, patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# kopf 1.45 posts core/v1 Events only (kopf._core.engines.posting); events.k8s.io is not used.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
# Applied only when the Prometheus Operator CRDs exist (checked at start-up).
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors, prometheusrules]
  verbs: [get, create, patch]
{{- if and .Values.peering.enabled .Values.watchNamespaces }}
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end -}}
