{{/*
Pod template spec of a reprocessing job (CronJob archive, Job replay). Call with
(dict "root" $ "job" .Values.reprocess.archive "name" "archive" "jobs" (list "archive")): `jobs` are the job names
the first argument may be.
*/}}
{{- define "kafka-eventing.reprocessPodSpec" -}}
{{- $root := .root }}
{{- $r := $root.Values.reprocess }}
{{- $args := .job.args }}
{{- if not $args }}
{{- fail (printf "reprocess.%s.args is required when reprocess.%s.enabled (e.g. [%s, ...]; see docs/reprocessing.md)" .name .name (first .jobs)) }}
{{- end }}
{{- if not (has (toString (first $args)) .jobs) }}
{{- fail (printf "reprocess.%s.args must start with one of %s, not %q" .name (join ", " .jobs) (toString (first $args))) }}
{{- end }}
serviceAccountName: {{ include "kafka-eventing.componentName" (dict "root" $root "component" "reprocess") }}
automountServiceAccountToken: false  # the jobs call no Kubernetes API
enableServiceLinks: false
restartPolicy: Never  # the Job's backoffLimit retries with a fresh pod
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
securityContext:
  {{- toYaml $r.podSecurityContext | nindent 2 }}
containers:
  - name: {{ .name }}
    image: {{ include "kafka-eventing.image" (dict "root" $root "role" $r) }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    # The image's entrypoint passes a job name (archive, replay, redrive, stats) to `python -m kafka_eventing.reprocess`.
    args:
      {{- range $args }}
      - {{ toString . | quote }}
      {{- end }}
    envFrom:
      - configMapRef:
          name: {{ include "kafka-eventing.configName" $root }}
      {{- with $r.envFrom }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- if or (include "kafka-eventing.kafkaSecretName" $root) $r.env }}
    env:
      {{- if include "kafka-eventing.kafkaSecretName" $root }}
      # The connection Secret's keys as files (see kafka.existingSecret), as for the receiver and dispatchers.
      - name: KE_KAFKA_SECRET_DIR
        value: {{ include "kafka-eventing.kafkaSecretDir" $root }}
      {{- end }}
      {{- with $r.env }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- end }}
    securityContext:
      {{- toYaml $r.securityContext | nindent 6 }}
    resources:
      {{- toYaml .job.resources | nindent 6 }}
    volumeMounts:
      - name: tmp
        mountPath: /tmp
      {{- with include "kafka-eventing.kafkaSecretMount" $root | trim }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- with $r.extraVolumeMounts }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
volumes:
  # The root filesystem is read-only; Spark's scratch space (SPARK_LOCAL_DIRS=/tmp/spark) and HOME live here.
  - name: tmp
    emptyDir:
      {{- with $r.tmpSizeLimit }}
      sizeLimit: {{ . }}
      {{- else }} {}
      {{- end }}
  {{- with include "kafka-eventing.kafkaSecretVolume" $root | trim }}
  {{- . | nindent 2 }}
  {{- end }}
  {{- with $r.extraVolumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $r.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $r.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $r.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
