"""KServe v2 front ends (HTTP routes, gRPC servicer, Triton-named metrics) over the classic manager.

Entry points: `http_routes.build_router` and `infer_http.KServeInferRoute`, `grpc.start_grpc_server`,
`metrics.register`.
"""
