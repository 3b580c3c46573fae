"""vlm-operator: runs vision-language models on SGLang with a profiler sidecar and gated canaries."""

__version__ = "0.1.0"
