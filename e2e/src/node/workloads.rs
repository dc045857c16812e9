//! Manifests the node tests apply: backend Deployments (the `backend` image) with their
//! Services, and TrafficRoutes.

/// A backend Deployment and its Service `name` (port 80 → 8080). Its Pods answer with
/// their name in `x-backend` and `version` in `x-version`; they turn ready
/// `ready_after_ms` after start and keep serving 5 s after SIGTERM.
pub fn backend_yaml(
    namespace: &str,
    name: &str,
    replicas: u32,
    version: &str,
    ready_after_ms: u64,
) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: {namespace}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {name}}}
  strategy:
    type: RollingUpdate
    rollingUpdate: {{maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      terminationGracePeriodSeconds: 30
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        seccompProfile: {{type: RuntimeDefault}}
      containers:
        - name: backend
          image: {image}
          imagePullPolicy: Never
          env:
            - name: POD_NAME
              valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
            - {{name: VERSION, value: "{version}"}}
            - {{name: READY_AFTER_MS, value: "{ready_after_ms}"}}
          ports:
            - {{name: http, containerPort: 8080}}
          readinessProbe:
            httpGet: {{path: /ready, port: 8080}}
            periodSeconds: 1
            failureThreshold: 1
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {{drop: [ALL]}}
---
apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {namespace}
spec:
  selector: {{app: {name}}}
  ports:
    - {{name: http, port: 80, targetPort: 8080}}
"#,
        image = super::image("backend"),
    )
}

/// A TrafficRoute for `host`, splitting across `backends` (Service, weight) on port 80.
pub fn route_yaml(namespace: &str, name: &str, host: &str, backends: &[(&str, u32)]) -> String {
    let mut yaml = format!(
        "apiVersion: switchyard.dev/v1alpha1\nkind: TrafficRoute\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  hosts: [\"{host}\"]\n  rules:\n  - backends:\n"
    );
    for (service, weight) in backends {
        yaml.push_str(&format!(
            "    - {{ service: {service}, port: 80, weight: {weight} }}\n"
        ));
    }
    yaml
}
