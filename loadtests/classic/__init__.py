"""The classic (Triton/KServe v2) path: Sluice against KServe, a null server and onnxruntime alone."""
