"""Deployments beyond one machine: the secrets and NATS configs a compose deployment
mounts (`secrets.py`), the Kubernetes manifests (`k8s.py`), and the health probe their
containers run (`probe.py`). Nothing here runs at import."""
