#!/usr/bin/env bash
# Install the Debian packages the tests run for real, if missing: servers (redis-server,
# prometheus), clients (chromium for the browser tests, Node; wrk and h2load for benchmarks), shellcheck (the node
# scripts `sluice launch` writes are checked with it), and Open MPI with sshd and ssh (the
# loopback smoke test of the multi-node TensorRT-LLM launch runs them: `make smoke-multinode`).
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v prometheus >/dev/null || need+=(prometheus)
command -v shellcheck >/dev/null || need+=(shellcheck)
command -v mpirun >/dev/null || need+=(openmpi-bin)
# sshd is in /usr/sbin, which a non-root PATH may lack.
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
# The browser tests drive Debian's Chromium through playwright (never a downloaded browser).
command -v chromium >/dev/null || need+=(chromium)
# Node runs the official openai npm package (tests/js); the machines ship Node 20, Debian's is the fallback.
command -v npm >/dev/null || need+=(nodejs npm)
# The classic benchmark's low-cost load clients (loadtests/classic/bench_lowcost.py): wrk and h2load.
command -v wrk >/dev/null || need+=(wrk)
command -v h2load >/dev/null || need+=(nghttp2-client)
# Fonts for legible screenshots (Chromium alone renders text with whatever is installed).
[ -d /usr/share/fonts/truetype/dejavu ] || need+=(fonts-dejavu-core)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
echo ">> apt-get install ${need[*]}"
$sudo apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
