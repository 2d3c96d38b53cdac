"""The fake HTTP APIs: Google's (OAuth token, Resource Manager, GKE, IAM credentials) and one
Kubernetes API per fake cluster; fake-gcs-server (a real part) and the fakes' client of it."""
