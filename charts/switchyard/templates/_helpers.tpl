{{/* The chart name, or nameOverride. */}}
{{- define "switchyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 42 | trimSuffix "-" -}}
{{- end -}}

{{/*
The base of every resource name: fullnameOverride, else the release name (plus the chart
name unless the release name contains it). At most 42 characters, so that the longest
suffix ("-envoy-fleet", "-probe-token") keeps Service names within 63.
*/}}
{{- define "switchyard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 42 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "switchyard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every resource; the component ("operator", "envoy") is added by each. */}}
{{- define "switchyard.labels" -}}
helm.sh/chart: {{ include "switchyard.chart" . }}
app.kubernetes.io/name: {{ include "switchyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: switchyard
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "switchyard.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "switchyard.operator.labels" -}}
{{ include "switchyard.labels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "switchyard.envoy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: envoy
{{- end -}}

{{- define "switchyard.envoy.labels" -}}
{{ include "switchyard.labels" . }}
app.kubernetes.io/component: envoy
{{- end -}}

{{- define "switchyard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "switchyard.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "switchyard.envoy.serviceAccountName" -}}
{{- if .Values.envoy.serviceAccount.create -}}
{{- default (printf "%s-envoy" (include "switchyard.fullname" .)) .Values.envoy.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.envoy.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The xDS Service (ClusterIP) in front of every Switchyard replica. */}}
{{- define "switchyard.xdsServiceName" -}}
{{- printf "%s-xds" (include "switchyard.fullname" .) -}}
{{- end -}}

{{/* The headless Service whose ready endpoints are the fleet (--envoy-service). */}}
{{- define "switchyard.fleetServiceName" -}}
{{- printf "%s-envoy-fleet" (include "switchyard.fullname" .) -}}
{{- end -}}

{{/* Secrets and mount path of mutual TLS for xDS (xds.tls). */}}
{{- define "switchyard.xdsTlsServerSecretName" -}}
{{- default (printf "%s-xds-server-tls" (include "switchyard.fullname" .)) .Values.xds.tls.serverSecret -}}
{{- end -}}

{{- define "switchyard.xdsTlsClientSecretName" -}}
{{- default (printf "%s-xds-client-tls" (include "switchyard.fullname" .)) .Values.xds.tls.clientSecret -}}
{{- end -}}

{{- define "switchyard.xdsTlsPath" -}}
/etc/switchyard/xds-tls
{{- end -}}

{{- define "switchyard.probeTokenSecretName" -}}
{{- default (printf "%s-probe-token" (include "switchyard.fullname" .)) .Values.probeToken.existingSecret -}}
{{- end -}}

{{- define "switchyard.leaseName" -}}
{{- default (printf "%s-leader" (include "switchyard.fullname" .)) .Values.leaderElection.leaseName -}}
{{- end -}}

{{/* repository:tag, or repository@digest. Argument: (dict "image" .Values.image "default" tag). */}}
{{- define "switchyard.image" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .default .image.tag) -}}
{{- end -}}
{{- end -}}

{{/* host:port for a SocketAddr: IPv6 addresses in brackets. Argument: (list address port). */}}
{{- define "switchyard.socketAddress" -}}
{{- $address := index . 0 -}}
{{- if contains ":" $address -}}
{{- printf "[%s]:%v" (trimAll "[]" $address) (index . 1) -}}
{{- else -}}
{{- printf "%s:%v" $address (index . 1) -}}
{{- end -}}
{{- end -}}

{{/*
The generated probe token (base64), the same in every template of one render. Generated
once, then kept (lookup): a changed Secret restarts no running replica, so a new token on
every upgrade would leave old and new replicas disagreeing. Where lookup sees no cluster
(`helm template`), every render makes a new one: use probeToken.existingSecret there.
*/}}
{{- define "switchyard.probeToken" -}}
{{- if not (hasKey .Values "__generatedProbeToken") -}}
{{- $token := randAlphaNum 32 | b64enc -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "switchyard.probeTokenSecretName" .) -}}
{{- if and $existing $existing.data -}}
{{- with index $existing.data "token" -}}
{{- $token = . -}}
{{- end -}}
{{- end -}}
{{- $_ := set .Values "__generatedProbeToken" $token -}}
{{- end -}}
{{- get .Values "__generatedProbeToken" -}}
{{- end -}}
