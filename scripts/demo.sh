#!/usr/bin/env bash
# The main job on a built-in default: two network namespaces joined by veth, a wirelane
# tunnel between them, TCP, UDP and latency workloads through it, and the figures next
# to the plain veth path. Run as root; namespaces are removed when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:/usr/local/go/bin:$HOME/go/bin:$PATH"
cargo build --release --locked -p wirelane -p wirelane-lab
exec target/release/wirelane-lab run lab/demo.toml --out "lab-results/demo-$(date -u +%Y%m%dT%H%M%SZ)"
