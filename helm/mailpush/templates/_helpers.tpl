{{/*
Chart name, truncated to 63 characters (DNS label limit).
*/}}
{{- define "mailpush.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name. StatefulSet pod names append "-<ordinal>" and the
controller-revision-hash label appends a hash, so keep it to 52 characters.
*/}}
{{- define "mailpush.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart label value.
*/}}
{{- define "mailpush.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels (immutable on a StatefulSet: never add to these).
*/}}
{{- define "mailpush.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mailpush.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Common labels.
*/}}
{{- define "mailpush.labels" -}}
helm.sh/chart: {{ include "mailpush.chart" . }}
{{ include "mailpush.selectorLabels" . }}
app.kubernetes.io/version: {{ (default .Chart.AppVersion .Values.image.tag) | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: consumer
app.kubernetes.io/part-of: mailpush
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
ServiceAccount name.
*/}}
{{- define "mailpush.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mailpush.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Headless (governing) Service name.
*/}}
{{- define "mailpush.headlessServiceName" -}}
{{- printf "%s-headless" (include "mailpush.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Container image reference: repository@digest, else repository:tag
(tag defaults to appVersion).
*/}}
{{- define "mailpush.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Pod terminationGracePeriodSeconds: mailpush's own shutdown grace plus a margin,
so Kubernetes never SIGKILLs a clean shutdown in progress.
*/}}
{{- define "mailpush.terminationGracePeriodSeconds" -}}
{{- add (int .Values.mailpush.shutdownGraceSeconds) (int .Values.mailpush.terminationGraceMarginSeconds) }}
{{- end }}

{{/*
librdkafka security.protocol: explicit value, else derived from SASL/TLS.
Empty means "leave librdkafka's default".
*/}}
{{- define "mailpush.securityProtocol" -}}
{{- if .Values.kafka.securityProtocol }}
{{- .Values.kafka.securityProtocol }}
{{- else if and .Values.kafka.sasl.enabled .Values.kafka.tls.enabled }}
{{- "SASL_SSL" }}
{{- else if .Values.kafka.sasl.enabled }}
{{- "SASL_PLAINTEXT" }}
{{- else if .Values.kafka.tls.enabled }}
{{- "SSL" }}
{{- end }}
{{- end }}

{{/*
Environment variable name for a librdkafka property:
"sasl.password" -> "MAILPUSH_KAFKA_SASL_PASSWORD".
*/}}
{{- define "mailpush.kafkaEnvName" -}}
{{- printf "MAILPUSH_KAFKA_%s" (. | replace "." "_" | replace "-" "_" | upper) }}
{{- end }}

{{/*
Mount path of the Kafka TLS Secret.
*/}}
{{- define "mailpush.tlsDir" -}}
/etc/mailpush/kafka-tls
{{- end }}

{{/*
Fail rendering on combinations the schema cannot express cleanly.
*/}}
{{- define "mailpush.validate" -}}
{{- if and .Values.kafka.sasl.enabled (not .Values.kafka.sasl.existingSecret) }}
{{- fail "kafka.sasl.enabled needs kafka.sasl.existingSecret (a Secret with the SASL username and password)" }}
{{- end }}
{{- if and .Values.kafka.tls.enabled (not .Values.kafka.tls.existingSecret) (or .Values.kafka.tls.certKey .Values.kafka.tls.keyKey .Values.kafka.tls.keyPasswordKey) }}
{{- fail "kafka.tls.certKey/keyKey/keyPasswordKey need kafka.tls.existingSecret" }}
{{- end }}
{{- if ne (empty .Values.kafka.tls.certKey) (empty .Values.kafka.tls.keyKey) }}
{{- fail "kafka.tls.certKey and kafka.tls.keyKey must be set together (mutual TLS)" }}
{{- end }}
{{- range $k, $v := .Values.kafka.properties }}
{{- $env := include "mailpush.kafkaEnvName" $k }}
{{- if has $env (list "MAILPUSH_KAFKA_SECURITY_PROTOCOL" "MAILPUSH_KAFKA_SASL_MECHANISM" "MAILPUSH_KAFKA_SASL_MECHANISMS" "MAILPUSH_KAFKA_SASL_USERNAME" "MAILPUSH_KAFKA_SASL_PASSWORD" "MAILPUSH_KAFKA_SSL_CA_LOCATION" "MAILPUSH_KAFKA_SSL_CERTIFICATE_LOCATION" "MAILPUSH_KAFKA_SSL_KEY_LOCATION" "MAILPUSH_KAFKA_SSL_KEY_PASSWORD" "MAILPUSH_KAFKA_BOOTSTRAP_SERVERS" "MAILPUSH_KAFKA_METADATA_BROKER_LIST") }}
{{- fail (printf "kafka.properties[%q] is set by the chart: use kafka.brokers, kafka.securityProtocol, kafka.sasl or kafka.tls instead" $k) }}
{{- end }}
{{- end }}
{{- end }}
