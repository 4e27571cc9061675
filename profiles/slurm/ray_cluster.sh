#!/usr/bin/env bash
# A Ray cluster inside a SLURM allocation, for real asynchrony (delay.mode: ray) across nodes: the
# head on the allocation's first node (where this batch script runs), a Ray worker node on each
# other node, then the given command with RAY_ADDRESS set (gmc joins with delay.ray_address: auto),
# and Ray stopped again whatever the command's status.
#   sbatch --nodes=2 --gpus-per-node=1 --cpus-per-task=16 profiles/slurm/ray_cluster.sh \
#       python -m gmc train --config train.yaml --set delay.mode=ray --set delay.workers=4 \
#       --set delay.ray_address=auto --set delay.worker_device=cuda --out runs/real-async
# GMC_RAY_PORT picks the head's port (default 6379); the nodes must reach each other on it. The
# cluster uses Ray's token authentication (RAY_AUTH_MODE=token): the token, ~/.ray/auth_token
# (made once if absent), travels to the worker nodes and the command in the environment.
#SBATCH --job-name=gmc-ray
#SBATCH --ntasks-per-node=1
set -euo pipefail
port=${GMC_RAY_PORT:-6379}
cpus=${SLURM_CPUS_PER_TASK:-$(nproc)}
mapfile -t nodes < <(scontrol show hostnames "${SLURM_JOB_NODELIST:?run me with sbatch}")
head_ip=$(hostname -I | awk '{print $1}')
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(ray get-auth-token --generate)
export RAY_AUTH_TOKEN
ray start --head --node-ip-address="$head_ip" --port="$port" --num-cpus="$cpus" --include-dashboard=false
trap 'ray stop --force >/dev/null 2>&1 || true' EXIT
for node in "${nodes[@]:1}"; do
    srun --overlap --nodes=1 --ntasks=1 -w "$node" ray start --address="$head_ip:$port" --num-cpus="$cpus" --block &
done
ray status --address="$head_ip:$port" >/dev/null  # the head answers
export RAY_ADDRESS="$head_ip:$port"
"$@"
