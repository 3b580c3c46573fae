{{/* Names and labels shared by every template. */}}

{{- define "vlm-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vlm-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Namespace of every namespaced object except the Roles in watchNamespaces and the dashboard's own. */}}
{{- define "vlm-operator.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "vlm-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vlm-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
app.kubernetes.io/component of an object, decided by the template file it comes from, so that every
object gets one (a template missing here fails the render) without each call site passing it.
*/}}
{{- define "vlm-operator.component" -}}
{{- $components := dict
  "crds.yaml" "crds"
  "deployment.yaml" "operator"
  "serviceaccount.yaml" "rbac"
  "rbac.yaml" "rbac"
  "rbac-aggregate.yaml" "rbac"
  "service.yaml" "metrics"
  "servicemonitor.yaml" "metrics"
  "prometheusrule.yaml" "alerts"
  "dashboard-configmap.yaml" "dashboard"
  "networkpolicy.yaml" "operator"
  "peering.yaml" "peering"
  "webhook.yaml" "injection"
  "judge.yaml" "judge"
  "test-connection.yaml" "test" -}}
{{- $file := base .Template.Name -}}
{{- if not (hasKey $components $file) -}}
{{- fail (printf "templates/_helpers.tpl: no app.kubernetes.io/component for %s" $file) -}}
{{- end -}}
{{- get $components $file -}}
{{- end -}}

{{- define "vlm-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "vlm-operator.selectorLabels" . }}
app.kubernetes.io/component: {{ include "vlm-operator.component" . }}
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
vlm_operator/cluster/client.py (server-side apply: create+patch; canary teardown: delete) and handlers.py
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
# The load hook's Jobs (spec.rollout.load): made while a canary is analysed, deleted after; list+watch: the operator
# follows which exist.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
# patch: the operator places its pods (removes its scheduling gate, pins a replacement to its partner's node),
# marks the pod it replaces (pod-deletion-cost) and labels each pod's role. Never create or delete.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
# kopf 1.45 posts core/v1 Events only (kopf._core.engines.posting); events.k8s.io is not used.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
# Applied only when the Prometheus Operator CRDs exist (checked at start-up); list+watch: the operator follows
# which exist, so it creates one that is missing (a new service after a burst, one deleted by hand).
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors, prometheusrules]
  verbs: [get, list, watch, create, patch]
# spec.autoscaling: the HPA KEDA makes for a service's ScaledObject, read for status.autoscaling (never written).
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [list, watch]
{{- if and .Values.peering.enabled .Values.watchNamespaces }}
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end -}}
