{{/* Names and labels shared by every template. */}}

{{- define "vllm-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vllm-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "vllm-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "vllm-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The operator's own objects carry component=controller, so they never match the selectors the operator uses for the
children it renders (component engine|router, plus vllm-operator.dev/deployment).
*/}}
{{- define "vllm-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vllm-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "vllm-operator.labels" -}}
{{ include "vllm-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "vllm-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "vllm-operator.metricsServiceName" -}}
{{- printf "%s-metrics" (include "vllm-operator.fullname" .) -}}
{{- end -}}

{{/*
RBAC rules the operator needs in every namespace it reconciles: exactly the (group, resource, verb) triples it sends,
plus what it must hold to grant the router's Role (Kubernetes' escalation check). No wildcards, no Secrets.
tests/integration/packaging/test_rbac_matches_usage.py compares them with the requests the operator makes;
README section "RBAC" explains every line.
*/}}
{{- define "vllm-operator.namespacedRules" -}}
# The custom resource: kopf lists and watches it, patches its annotations (progress, last-handled-configuration);
# the controller reads it back after a child changed and writes status through the subresource.
- apiGroups: ["vllm-operator.dev"]
  resources: ["vllmdeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["vllm-operator.dev"]
  resources: ["vllmdeployments/status"]
  verbs: ["patch"]
# Children rendered per VLLMDeployment: listed by label to converge, server-side applied when missing or when their
# spec hash changed (an apply PATCH that creates the object is authorized as create too), deleted when the plan drops
# them. Deployments are also watched (status, and the health loop's cache of the pools' replicas), PDBs watched by
# the health loop's cache for the disruption floor.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps", "serviceaccounts", "persistentvolumeclaims"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors", "prometheusrules"]
  verbs: ["list", "create", "patch", "delete"]
# KEDA ScaledObjects of pools with autoscaling (only when KEDA's CRD is installed; KEDA's HPA then owns replicas).
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["list", "create", "patch", "delete"]
# ... and the HPAs KEDA makes for them, read for the pools' autoscaler status.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list"]
# The health loop watches engine pods (status, termination messages; listed when its watch is not current) and
# deletes a Stalled one within its budget.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "delete"]
# Events on VLLMDeployments (the controller's and kopf's).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Not used by the operator itself: granted to the router's Role, which the escalation check only lets a creator
# write when it holds the same permissions.
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
{{- end -}}

{{/* Cluster-scoped reads: nodes for `accelerator.type: auto`. */}}
{{- define "vllm-operator.nodeRules" -}}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list"]
{{- end -}}

{{/*
VLLMWorkloadClasses are cluster-scoped: read (listed once, then watched for edits), never written.
*/}}
{{- define "vllm-operator.classRules" -}}
- apiGroups: ["vllm-operator.dev"]
  resources: ["vllmworkloadclasses"]
  verbs: ["list", "watch"]
{{- end -}}

{{/*
kopf's own observers (read-only, cluster-scoped): it watches CustomResourceDefinitions to notice resources that
appear or go, and in namespaced mode lists/watches Namespaces to learn which watched namespaces exist. Denied, kopf
retries each request for ~54 s (its error backoffs) before falling back — for Namespaces that delays the whole
start — so the chart grants them instead of relying on the fallback.
*/}}
{{- define "vllm-operator.kopfClusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if eq .Values.watch.mode "namespaced" }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end -}}

{{- define "vllm-operator.webhookServiceName" -}}
{{- printf "%s-webhook" (include "vllm-operator.fullname" .) -}}
{{- end -}}

{{/* Cluster-scoped: the release namespace keeps two releases in two namespaces apart. */}}
{{- define "vllm-operator.webhookConfigurationName" -}}
{{- printf "%s-%s" (include "vllm-operator.fullname" .) .Release.Namespace | trunc 253 -}}
{{- end -}}

{{- define "vllm-operator.webhookCASecretName" -}}
{{- printf "%s-webhook-ca" (include "vllm-operator.fullname" .) -}}
{{- end -}}
