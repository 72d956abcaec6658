"""KServe v2 front ends (HTTP routes, gRPC servicer, Triton-named metrics) over the classic manager.

Entry points: `http.build_router`, `grpc.start_grpc_server`, `metrics.register`.
"""
