"""Local Kubernetes control plane for integration tests and the demo (driven by ``hack/testbed``).

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as plain processes on
loopback, from binaries that ``hack/build-binaries.sh`` built from the Go module proxy. Only the
standard library and the cached binaries are used, so the testbed starts on a fresh machine
before any Python dependency is installed.
"""
