#!/usr/bin/env bash
# The GPU check of gmc.integrations.verl (docs/integrations.md): three steps of verl 0.9 training a
# small Qwen3 on one GPU with gmc's group-mass capping, the policy loss gmc_gmc, its group weights
# computed by uid in verl's driver by the trainer gmc_<mode>.
#
#   bash bench/verl_gpu.sh MODEL_PATH [MODE]
#
# MODEL_PATH: a local Qwen3 checkpoint (Qwen3-0.6B or Qwen3-1.7B fit one 80 GB GPU); nothing is
# downloaded. MODE: verl's trainer mode, sync (default) or colocate_async (samples one version
# stale, so that the cap can bind). The data are gmc's (bench/verl_task.py: MATH from GMC_DATA_ROOT,
# else gmc's synthetic arithmetic).
#
# The environment must hold verl 0.9 with its vLLM extra and TransferQueue (`pip install
# "verl[vllm]==0.9.1"`, which pins its own torch, vLLM and transformers: a virtual environment of
# its own). gmc goes into it without its dependencies (`pip install -e . --no-deps`, done here), so
# that verl's `verl.plugins` entry point finds its losses (else PYTHONPATH and VERL_USE_EXTERNAL_MODULES
# load them); gmc's trainers load by VERL_USE_EXTERNAL_MODULES=gmc.integrations.verl_trainer, set
# here. The check refuses to start, naming what is missing. It writes $OUT/verl_gpu.log (OUT default bench/results) and passes when verl ran three
# steps and logged gmc's group statistics (gmc/ratio/frac_groups_capped) at each.
set -uo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:?usage: bash bench/verl_gpu.sh MODEL_PATH [sync|colocate_async]}"
MODE="${2:-sync}"
OUT="${OUT:-bench/results}"
PYTHON="${PYTHON:-python3}"
STEPS=3
PROMPTS=8       # a step's prompts: data.train_batch_size, and the one mini-batch gmc_gmc takes
GROUP=4         # responses per prompt: rollout.n
LIMIT=512       # response tokens: data.max_response_length, and seq_sum_const's divisor
mkdir -p "$OUT"
LOG="$OUT/verl_gpu.log"
: > "$LOG"

case "$MODE" in sync | colocate_async) ;; *) echo "MODE must be sync or colocate_async, got $MODE" >&2; exit 2 ;; esac
[ -f "$MODEL/config.json" ] || { echo "MODEL_PATH $MODEL holds no config.json: give a local Qwen3 checkpoint" >&2; exit 2; }
command -v nvidia-smi > /dev/null || { echo "no nvidia-smi: this check needs a CUDA GPU" >&2; exit 2; }
"$PYTHON" - << 'EOF' || exit 2
import importlib.util, sys
missing = [m for m in ("verl", "vllm", "ray", "transfer_queue", "hydra", "pydantic", "yaml") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing in this environment: {', '.join(missing)} (pip install 'verl[vllm]==0.9.1')")
from importlib.metadata import version
if not version("verl").startswith("0.9."):
    sys.exit(f"verl {version('verl')} is installed; gmc.integrations.verl is tested with verl 0.9")
EOF
# gmc into verl's environment without its dependencies, so that verl's entry point finds its losses;
# where that install cannot be made (no network for a build backend), gmc loads from this checkout.
# The trainers (which import the losses' module) load by VERL_USE_EXTERNAL_MODULES either way.
export VERL_USE_EXTERNAL_MODULES=gmc.integrations.verl_trainer
if ! "$PYTHON" -m pip install -q -e . --no-deps --no-build-isolation >> "$LOG" 2>&1; then
  echo "pip could not install gmc here ($LOG): gmc loads from $PWD" | tee -a "$LOG"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
# the trainers' module imported directly (its errors shown), then as verl finds it: on `import verl`,
# by VERL_USE_EXTERNAL_MODULES
"$PYTHON" -c "import gmc.integrations.verl_trainer" >> "$LOG" 2>&1 \
  || { tail -5 "$LOG"; echo "gmc.integrations.verl_trainer does not import ($LOG)" >&2; exit 2; }
"$PYTHON" -c "import verl; from verl.trainer.ppo.core_algos import get_policy_loss_fn; get_policy_loss_fn('gmc_gmc')
from verl.trainer.ppo.v1 import get_trainer_cls; get_trainer_cls('gmc_$MODE')" \
  >> "$LOG" 2>&1 || { tail -5 "$LOG"; echo "verl does not find gmc's loss or trainer on import ($LOG)" >&2; exit 2; }

"$PYTHON" bench/verl_task.py "$OUT/verl_data" $((PROMPTS * STEPS * 2)) "$PROMPTS" | tee -a "$LOG" || exit 1

start=$(date +%s)
"$PYTHON" -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  algorithm.use_kl_in_reward=False \
  data.train_files="$OUT/verl_data/train.parquet" \
  data.val_files="$OUT/verl_data/val.parquet" \
  data.train_batch_size=$PROMPTS \
  data.max_prompt_length=1024 \
  data.max_response_length=$LIMIT \
  data.filter_overlong_prompts=True \
  data.truncation=error \
  data.dataloader_num_workers=0 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.model.use_remove_padding=True \
  actor_rollout_ref.model.enable_gradient_checkpointing=True \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=$PROMPTS \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.ppo_epochs=1 \
  actor_rollout_ref.actor.use_kl_loss=False \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.actor.policy_loss.loss_mode=gmc_gmc \
  actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm \
  actor_rollout_ref.actor.loss_scale_factor=$LIMIT \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=$GROUP \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.rollout.calculate_log_probs=True \
  trainer.v1.trainer_mode="gmc_$MODE" \
  trainer.n_gpus_per_node=1 \
  trainer.nnodes=1 \
  trainer.total_training_steps=$STEPS \
  trainer.val_before_train=False \
  trainer.test_freq=-1 \
  trainer.save_freq=-1 \
  trainer.logger='[console]' \
  trainer.project_name=gmc \
  trainer.experiment_name="verl_gmc_gmc_$MODE" \
  trainer.default_local_dir="$OUT/verl_checkpoints" \
  >> "$LOG" 2>&1
status=$?
echo "verl: exit $status after $(($(date +%s) - start)) s (log: $LOG)"
# verl's console logger prints a step's metrics as one line, "step:N - key:value - ..." (from
# inside a Ray actor, behind its "(TaskRunnerV1 pid=...)" prefix)
awk '/step:[0-9]+ - / {
  line = substr($0, index($0, "step:")); n = split(line, part, " - "); capped = ""; loss = ""
  for (i = 2; i <= n; i++) {
    if (part[i] ~ /^gmc\/ratio\/frac_groups_capped:/) capped = part[i]
    if (part[i] ~ /^actor\/pg_loss:/) loss = part[i]
  }
  if (capped != "") print part[1], capped, loss
}' "$LOG" > "$OUT/verl_gpu.steps"
cat "$OUT/verl_gpu.steps"
steps=$(wc -l < "$OUT/verl_gpu.steps")
if [ "$status" -ne 0 ] || [ "$steps" -lt "$STEPS" ]; then
  tail -30 "$LOG"
  echo "FAILED: $steps of $STEPS steps logged gmc's group statistics" >&2
  exit 1
fi
echo "passed: $STEPS steps of verl with gmc_gmc (trainer gmc_$MODE)"
