{{/* The chart name, or nameOverride. */}}
{{- define "gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The resources' name: the release name, with the chart name unless it holds it already. */}}
{{- define "gateway.fullname" -}}
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

{{- define "gateway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "gateway.labels" -}}
helm.sh/chart: {{ include "gateway.chart" . }}
{{ include "gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* What selects the gateway pods. */}}
{{- define "gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gateway.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* The port of a listen address such as ":8080" or "0.0.0.0:9090". */}}
{{- define "gateway.port" -}}
{{- $port := regexFind "[0-9]+$" . }}
{{- if not $port }}
{{- fail (printf "listen address %q has no port" .) }}
{{- end }}
{{- $port }}
{{- end }}

{{/* The public port: config.listen (the gateway's default :8080 when unset). */}}
{{- define "gateway.httpPort" -}}
{{- include "gateway.port" (.Values.config.listen | default ":8080") }}
{{- end }}

{{/* The admin port: config.admin_listen, which must not be loopback (probes and Prometheus
connect to the pod IP). */}}
{{- define "gateway.adminPort" -}}
{{- $listen := .Values.config.admin_listen | default "" }}
{{- if or (not $listen) (hasPrefix "127." $listen) (hasPrefix "localhost:" $listen) (hasPrefix "[::1]:" $listen) }}
{{- fail "config.admin_listen must listen on the pod's address (for example \"0.0.0.0:9090\"): the kubelet's probes and Prometheus cannot reach a loopback listener" }}
{{- end }}
{{- include "gateway.port" $listen }}
{{- end }}

{{/* Fails when a secret was put into the config (it would land in the ConfigMap). */}}
{{- define "gateway.noSecretsInConfig" -}}
{{- if .Values.config.admin_token }}
{{- fail "config.admin_token: the admin token does not belong in the ConfigMap; set adminToken.value or adminToken.existingSecret" }}
{{- end }}
{{- if (.Values.config.redis | default dict).password }}
{{- fail "config.redis.password: the Redis password does not belong in the ConfigMap; set redis.password or redis.existingSecret" }}
{{- end }}
{{- end }}

{{/* The Secret holding the admin token and its key. */}}
{{- define "gateway.adminSecretName" -}}
{{- if and .Values.adminToken.existingSecret .Values.adminToken.value }}
{{- fail "adminToken: set value or existingSecret, not both" }}
{{- end }}
{{- .Values.adminToken.existingSecret | default (printf "%s-admin" (include "gateway.fullname" .)) }}
{{- end }}

{{- define "gateway.adminSecretKey" -}}
{{- if .Values.adminToken.existingSecret }}
{{- .Values.adminToken.existingSecretKey }}
{{- else -}}
token
{{- end }}
{{- end }}

{{/* The admin token the chart's own Secret holds: the given value, else the one already in
the cluster (so upgrades keep it), else a new random one. */}}
{{- define "gateway.adminToken" -}}
{{- if .Values.adminToken.value }}
{{- if lt (len .Values.adminToken.value) 16 }}
{{- fail "adminToken.value must be at least 16 characters" }}
{{- end }}
{{- .Values.adminToken.value }}
{{- else }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "gateway.adminSecretName" .) }}
{{- if and $existing $existing.data (hasKey $existing.data "token") }}
{{- index $existing.data "token" | b64dec }}
{{- else }}
{{- randAlphaNum 48 }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret holding the Redis password and its key; empty when there is no password. */}}
{{- define "gateway.redisSecretName" -}}
{{- if and .Values.redis.existingSecret .Values.redis.password }}
{{- fail "redis: set password or existingSecret, not both" }}
{{- end }}
{{- if .Values.redis.existingSecret }}
{{- .Values.redis.existingSecret }}
{{- else if .Values.redis.password }}
{{- printf "%s-redis" (include "gateway.fullname" .) }}
{{- end }}
{{- end }}

{{- define "gateway.redisSecretKey" -}}
{{- if .Values.redis.existingSecret }}
{{- .Values.redis.existingSecretKey }}
{{- else -}}
password
{{- end }}
{{- end }}
