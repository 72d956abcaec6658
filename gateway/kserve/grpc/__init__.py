"""The KServe v2 gRPC server: its call gate, bounds, streams and ModelInfer."""
