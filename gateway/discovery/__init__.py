"""Worker discovery from Kubernetes EndpointSlices (`--k8s-discovery`), beside static
`--worker` / `--workers-file` and self-registration. See `k8s.py` for the contract."""

from __future__ import annotations

from gateway.discovery.k8s import K8sDiscovery
from gateway.discovery.spec import DiscoverySpec, parse_discovery

__all__ = ["DiscoverySpec", "K8sDiscovery", "parse_discovery"]
