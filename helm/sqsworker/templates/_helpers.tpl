{{- define "sqsworker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sqsworker.fullname" -}}
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

{{- define "sqsworker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sqsworker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sqsworker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sqsworker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: worker
app.kubernetes.io/part-of: sqsworker
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "sqsworker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sqsworker.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Seconds Kubernetes waits between SIGTERM and SIGKILL: enough for running handlers
(shutdownTimeout), a long poll under way (waitTime) and a margin; a larger value
set by the user is kept, a smaller one is raised.
*/}}
{{- define "sqsworker.gracePeriod" -}}
{{- $w := .Values.worker }}
{{- $shutdown := 30 }}
{{- if not (kindIs "invalid" $w.shutdownTimeout) }}{{ $shutdown = ceil $w.shutdownTimeout | int }}{{ end }}
{{- $wait := 20 }}
{{- if not (kindIs "invalid" $w.waitTime) }}{{ $wait = int $w.waitTime }}{{ end }}
{{- $needed := add $shutdown $wait (int .Values.terminationGraceMarginSeconds) }}
{{- $asked := 0 }}
{{- if not (kindIs "invalid" .Values.terminationGracePeriodSeconds) }}{{ $asked = int .Values.terminationGracePeriodSeconds }}{{ end }}
{{- max $needed $asked }}
{{- end }}

{{- define "sqsworker.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
