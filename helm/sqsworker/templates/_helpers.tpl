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
set by the user is kept, a smaller one is raised. Several handlers shut down side by
side: the one that needs longest counts.
*/}}
{{- define "sqsworker.gracePeriod" -}}
{{- $w := .Values.worker }}
{{- $shutdown := 30 }}
{{- if not (kindIs "invalid" $w.shutdownTimeout) }}{{ $shutdown = ceil $w.shutdownTimeout | int }}{{ end }}
{{- $wait := 20 }}
{{- if not (kindIs "invalid" $w.waitTime) }}{{ $wait = int $w.waitTime }}{{ end }}
{{- $needed := add $shutdown $wait }}
{{- if .Values.handlers }}{{ $needed = 0 }}{{ end }}
{{- range .Values.handlers }}
{{- $own := $shutdown }}
{{- if not (kindIs "invalid" .shutdownTimeout) }}{{ $own = ceil .shutdownTimeout | int }}{{ end }}
{{- $ownWait := $wait }}
{{- if not (kindIs "invalid" .waitTime) }}{{ $ownWait = int .waitTime }}{{ end }}
{{- $needed = max $needed (add $own $ownWait) }}
{{- end }}
{{- $needed = add $needed (int .Values.terminationGraceMarginSeconds) }}
{{- $asked := 0 }}
{{- if not (kindIs "invalid" .Values.terminationGracePeriodSeconds) }}{{ $asked = int .Values.terminationGracePeriodSeconds }}{{ end }}
{{- max $needed $asked }}
{{- end }}

{{- define "sqsworker.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The name `sqsworker run` gives a handler for its own options: the part of MODULE:ATTR
after the last ':' or '.', as SQSWORKER_<NAME>__<OPTION> spells it.
*/}}
{{- define "sqsworker.handlerEnvName" -}}
{{- regexReplaceAll "[^A-Za-z0-9]" (splitList "." (splitList ":" . | last) | last) "_" | upper }}
{{- end }}

{{/*
What cannot work, refused before anything is applied: one handler or a list of them,
and no option the whole process shares set for one handler.
*/}}
{{- define "sqsworker.check" -}}
{{- $w := .Values.worker }}
{{- if .Values.handlers }}
{{- if or $w.handler $w.queue }}
{{- fail "set either worker.handler and worker.queue (one handler) or handlers (several), not both" }}
{{- end }}
{{- $seen := dict }}
{{- range $i, $h := .Values.handlers }}
{{- $name := include "sqsworker.handlerEnvName" $h.handler }}
{{- if hasKey $seen $name }}
{{- fail (printf "handlers[%d] (%s) has the name %s of another handler, and per-handler options could not tell them apart: import one under another name" $i $h.handler $name) }}
{{- end }}
{{- $_ := set $seen $name true }}
{{- with $h.queue }}
{{- $queue := printf "queue %s" . }}
{{- if hasKey $seen $queue }}
{{- fail (printf "handlers[%d] (%s) has the queue %s of another handler, and each would take messages meant for the other: give each handler its own queue" $i $h.handler .) }}
{{- end }}
{{- $_ := set $seen $queue true }}
{{- end }}
{{- end }}
{{- else }}
{{- if not $w.handler }}
{{- fail "worker.handler is required: MODULE:ATTR of the handler, e.g. app:process (or list several under handlers)" }}
{{- end }}
{{- if not $w.queue }}
{{- fail "worker.queue is required: the queue's name or URL (or list handlers, each with its queue)" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A KEDA aws-sqs-queue trigger's metadata beyond the queue: the handler's own region
and endpoint where it has them, else the worker's.
*/}}
{{- define "sqsworker.kedaQueueMetadata" -}}
{{- $keda := .root.Values.autoscaling.keda }}
{{- $w := .root.Values.worker -}}
activationQueueLength: {{ $keda.activationQueueLength | quote }}
scaleOnInFlight: {{ $keda.scaleOnInFlight | quote }}
awsRegion: {{ .region | default $keda.awsRegion | default $w.region | quote }}
{{- with (.endpoint | default $w.endpointUrl) }}
awsEndpoint: {{ . | quote }}
{{- end }}
{{- end }}
