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
{{- if $r.cluster.enabled }}
{{- /* Executors write the archive (and its checkpoint) and a replay's results and journal: on another pod's local
disk they are lost, so a local path must be under a volume every pod mounts (reprocess.extraVolumeMounts). */}}
{{- range $i, $a := $args }}
{{- $flag := regexReplaceAll "=.*" (toString $a) "" }}
{{- $path := "" }}
{{- if contains "=" (toString $a) }}{{ $path = regexReplaceAll "^[^=]*=" (toString $a) "" }}
{{- else if lt (add1 $i) (len $args) }}{{ $path = toString (index $args (add1 $i)) }}{{ end }}
{{- if and (has $flag (list "--output" "--run-dir")) $path }}
{{- if not (contains "://" $path) }}
{{- $shared := false }}
{{- range $r.extraVolumeMounts }}
{{- $mount := trimSuffix "/" (toString .mountPath) }}
{{- if or (eq $path $mount) (hasPrefix (printf "%s/" $mount) $path) }}{{ $shared = true }}{{ end }}
{{- end }}
{{- if not $shared }}
{{- fail (printf "reprocess.%s.args: %s %s is not on a volume of reprocess.extraVolumeMounts; with reprocess.cluster.enabled the executor pods write there too, so it must be a volume they all mount (a ReadWriteMany PersistentVolumeClaim) or a URI such as s3a://" $.name $flag $path) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
serviceAccountName: {{ include "kafka-eventing.componentName" (dict "root" $root "component" "reprocess") }}
{{- if $r.cluster.enabled }}
automountServiceAccountToken: true  # the driver starts and deletes its executor pods (templates/reprocess/rbac.yaml)
{{- else }}
automountServiceAccountToken: false  # local mode calls no Kubernetes API
{{- end }}
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
      {{- if $r.cluster.enabled }}
      {{- /* After the job's own args: argparse keeps the last --master. */}}
      {{- range (include "kafka-eventing.reprocessClusterArgs" $root | fromYamlArray) }}
      - {{ . | quote }}
      {{- end }}
      {{- end }}
    envFrom:
      - configMapRef:
          name: {{ include "kafka-eventing.configName" $root }}
      {{- with $r.envFrom }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- if or (include "kafka-eventing.kafkaSecretName" $root) $r.env $r.cluster.enabled }}
    env:
      {{- if $r.cluster.enabled }}
      # The driver's address for its executors, and its pod as their owner: executors go when the driver pod goes.
      - name: POD_NAME
        valueFrom:
          fieldRef:
            fieldPath: metadata.name
      - name: POD_IP
        valueFrom:
          fieldRef:
            fieldPath: status.podIP
      {{- end }}
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
    {{- if $r.cluster.enabled }}
    ports:
      - name: driver-rpc
        containerPort: 7078
      - name: blockmanager
        containerPort: 7079
    {{- end }}
    volumeMounts:
      - name: tmp
        mountPath: /tmp
      {{- if $r.cluster.enabled }}
      - name: executor-template
        mountPath: /opt/kafka-eventing/spark
        readOnly: true
      {{- end }}
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
  {{- if $r.cluster.enabled }}
  - name: executor-template
    configMap:
      name: {{ include "kafka-eventing.componentName" (dict "root" $root "component" "reprocess-executor") }}
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


{{/*
Spark on Kubernetes (reprocess.cluster): the `--master`/`--conf` args that make the job's pod the driver (client
mode) of `executors` executor pods. A YAML list. The driver creates no Service and no PersistentVolumeClaim (executors
reach it at its pod IP; volumes are the chart's): the `driver.service`/`PersistentVolumeClaim` settings keep Spark
from deleting them at the end, which its Role does not allow.
*/}}
{{- define "kafka-eventing.reprocessClusterArgs" -}}
{{- $r := .Values.reprocess }}
{{- $c := $r.cluster }}
{{- $conf := dict
  "spark.kubernetes.namespace" .Release.Namespace
  "spark.kubernetes.container.image" (include "kafka-eventing.image" (dict "root" . "role" $r))
  "spark.kubernetes.container.image.pullPolicy" .Values.image.pullPolicy
  "spark.kubernetes.driver.pod.name" "$(POD_NAME)"
  "spark.driver.host" "$(POD_IP)"
  "spark.driver.bindAddress" "$(POD_IP)"
  "spark.driver.port" "7078"
  "spark.driver.blockManager.port" "7079"
  "spark.executor.instances" (toString $c.executors)
  "spark.executor.cores" (toString $c.executorCores)
  "spark.executor.memory" (toString $c.executorMemory)
  "spark.kubernetes.executor.podTemplateFile" "/opt/kafka-eventing/spark/executor.yaml"
  "spark.kubernetes.executor.podTemplateContainerName" "executor"
  "spark.kubernetes.executor.deleteOnTermination" "true"
  "spark.kubernetes.driver.service.deleteOnTermination" "false"
  "spark.kubernetes.driver.ownPersistentVolumeClaim" "false"
  "spark.kubernetes.driver.reusePersistentVolumeClaim" "false"
  "spark.scheduler.minRegisteredResourcesRatio" "1.0"
  "spark.scheduler.maxRegisteredResourcesWaitingTime" "300s"
}}
{{- /* sprig merge keeps the first value of a key: the chart's own settings win over reprocess.cluster.conf */}}
{{- $conf = merge (dict) $conf $c.conf }}
- --master
- {{ required "reprocess.cluster.master is required (k8s://https://<API server>)" $c.master }}
{{- range $k := keys $conf | sortAlpha }}
- --conf={{ $k }}={{ get $conf $k }}
{{- end }}
{{- end }}
