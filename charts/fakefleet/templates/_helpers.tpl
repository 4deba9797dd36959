{{/* The release's full name: the operator's Deployment, ServiceAccount and RBAC objects. */}}
{{- define "fakefleet.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fakefleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fakefleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "fakefleet.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fakefleet.labels" -}}
{{ include "fakefleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The namespaces the operator serves, one per line: the release's own and watch.namespaces
     (nothing when it serves all of them). */}}
{{- define "fakefleet.namespaces" -}}
{{- if not .Values.watch.allNamespaces -}}
{{- $namespaces := list .Release.Namespace -}}
{{- range .Values.watch.namespaces -}}
{{- $namespaces = append $namespaces . -}}
{{- end -}}
{{- range $namespaces | uniq }}
{{ . }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The rules of the operator's Role or ClusterRole: generated from
     operators/handlers/permissions.py into files/, plus rbac.extraRules. */}}
{{- define "fakefleet.rules" -}}
{{ .root.Files.Get "files/rbac-namespaced.yaml" }}
{{- if .clusterWide }}
{{ .root.Files.Get "files/rbac-cluster-wide.yaml" }}
{{- end }}
{{- with .root.Values.rbac.extraRules }}
{{ toYaml . }}
{{- end }}
{{- end -}}
