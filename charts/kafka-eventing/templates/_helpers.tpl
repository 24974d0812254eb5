{{/*
Chart name, truncated to 63 characters (the DNS label limit of Kubernetes names).
*/}}
{{- define "kafka-eventing.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified prefix of every object name: the release name, plus the chart name unless the release name
already contains it. Truncated to 63 characters.
*/}}
{{- define "kafka-eventing.fullname" -}}
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

{{/*
"<fullname>-<suffix>" with the 63-character limit applied to the whole name.
*/}}
{{- define "kafka-eventing.componentName" -}}
{{- $full := include "kafka-eventing.fullname" .root }}
{{- printf "%s-%s" ($full | trunc (int (sub 62 (len .component)))) .component | trimSuffix "-" }}
{{- end }}

{{- define "kafka-eventing.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels. Call with (dict "root" $ "component" "receiver").
*/}}
{{- define "kafka-eventing.labels" -}}
helm.sh/chart: {{ include "kafka-eventing.chart" .root }}
{{ include "kafka-eventing.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: kafka-eventing
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels: stable across upgrades (Deployment selectors are immutable).
*/}}
{{- define "kafka-eventing.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kafka-eventing.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{/*
Image reference of a role: registry/repository:tag, the tag defaulting to the chart's appVersion.
Call with (dict "root" $ "role" .Values.receiver).
*/}}
{{- define "kafka-eventing.image" -}}
{{- $tag := default .root.Chart.AppVersion .root.Values.image.tag }}
{{- $registry := .root.Values.image.registry | trimSuffix "/" }}
{{- if $registry }}
{{- printf "%s/%s:%s" $registry .role.image.repository $tag }}
{{- else }}
{{- printf "%s:%s" .role.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "kafka-eventing.configName" -}}
{{- include "kafka-eventing.componentName" (dict "root" . "component" "config") }}
{{- end }}

{{/*
Name of the connection Secret: the existing one, or the dev Secret the chart creates. Empty when neither.
*/}}
{{- define "kafka-eventing.kafkaSecretName" -}}
{{- if .Values.kafka.existingSecret }}
{{- .Values.kafka.existingSecret }}
{{- else if .Values.kafka.secret.create }}
{{- include "kafka-eventing.componentName" (dict "root" . "component" "kafka") }}
{{- end }}
{{- end }}

{{/* Where the receiver mounts the connection Secret (the controller uses the same path in dispatchers). */}}
{{- define "kafka-eventing.kafkaSecretDir" -}}
/etc/kafka-secret
{{- end }}

{{/*
KE_KAFKA_EXTRA: extraConfig plus enable.idempotence, as "k=v,k=v" sorted by key so renders are stable.
*/}}
{{- define "kafka-eventing.kafkaExtra" -}}
{{- $extra := deepCopy .Values.kafka.extraConfig }}
{{- /* Only an explicit choice: unset, the provider preset decides (Event Hubs has no idempotent producer). */}}
{{- if not (kindIs "invalid" .Values.kafka.idempotence) }}
{{- $_ := set $extra "enable.idempotence" (ternary "true" "false" .Values.kafka.idempotence) }}
{{- end }}
{{- $items := list }}
{{- range $k := keys $extra | sortAlpha }}
{{- $v := toString (get $extra $k) }}
{{- if or (contains "," $v) (contains "," $k) (contains "=" $k) }}
{{- fail (printf "kafka.extraConfig %q: keys and values must not contain ',' (and keys no '=')" $k) }}
{{- end }}
{{- $items = append $items (printf "%s=%s" $k $v) }}
{{- end }}
{{- join "," $items }}
{{- end }}

{{/*
Connection Secret volume + mount of the receiver (the controller reads the Secret through the API, and mounts it
into the dispatchers itself).
*/}}
{{- define "kafka-eventing.kafkaSecretVolume" -}}
{{- with include "kafka-eventing.kafkaSecretName" . }}
- name: kafka-secret
  secret:
    secretName: {{ . }}
{{- end }}
{{- end }}

{{- define "kafka-eventing.kafkaSecretMount" -}}
{{- if include "kafka-eventing.kafkaSecretName" . }}
- name: kafka-secret
  mountPath: {{ include "kafka-eventing.kafkaSecretDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
Names of the chart's CRDs (files/crds/) that exist in the cluster but not as objects of this release: Knative
Eventing's Broker and Trigger, another implementation's KafkaChannel, a copy applied with kubectl. The chart never
renders over them (Helm would refuse to adopt them, or take over what another owner manages). A YAML list; empty
with `helm template` (no cluster to look up).
*/}}
{{- define "kafka-eventing.foreignCrds" -}}
{{- $foreign := list }}
{{- range $path, $_ := .Files.Glob "files/crds/*.yaml" }}
{{- $name := (($.Files.Get $path | fromYaml).metadata).name }}
{{- $live := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" $name }}
{{- if $live }}
{{- $release := dig "metadata" "annotations" "meta.helm.sh/release-name" "" $live }}
{{- $namespace := dig "metadata" "annotations" "meta.helm.sh/release-namespace" "" $live }}
{{- if not (and (eq $release $.Release.Name) (eq $namespace $.Release.Namespace)) }}
{{- $foreign = append $foreign $name }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml $foreign }}
{{- end }}

{{/*
The receiver's certificate Secret (receiver.tls): the one named, else <fullname>-receiver-tls.
*/}}
{{- define "kafka-eventing.receiverTlsSecretName" -}}
{{- .Values.receiver.tls.secretName | default (include "kafka-eventing.componentName" (dict "root" . "component" "receiver-tls")) }}
{{- end }}

{{/*
Where the receiver's certificate Secret is mounted: a whole-directory mount (no subPath), so the kubelet's
atomic update of a rotated Secret reaches the running pods.
*/}}
{{- define "kafka-eventing.receiverTlsDir" -}}
/etc/receiver-tls
{{- end }}

{{/*
Host names of the receiver's certificate: both receiver Services (short and cluster-local forms) and
receiver.tls.extraDnsNames.
*/}}
{{- define "kafka-eventing.receiverTlsDnsNames" -}}
{{- $names := list }}
{{- range $svc := list .Values.receiver.service.name .Values.receiver.sinkService.name }}
{{- $names = concat $names (list (printf "%s.%s.svc" $svc $.Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc $.Release.Namespace)) }}
{{- end }}
{{- toYaml (concat $names .Values.receiver.tls.extraDnsNames | uniq) }}
{{- end }}
