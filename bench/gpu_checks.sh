#!/usr/bin/env bash
# The CUDA checks, in one go (a lent GPU machine's time is short). Each part runs under its own time limit, so
# one that fails or hangs does not cost the others; its log goes to OUT/<part>.log and its tail is printed.
#
#   bash bench/gpu_checks.sh OUT [PARTS...]
#       parts: smoke floors vs-trl train-memory doctor-memory attention compiled goal chunked-head memory-options
#              layouts packing colocate offload recompute (default: all, in that order)
#
# smoke         `grpo train` of the ci-tiny recipe in bf16 on the GPU: 4 steps straight, 2 + --resume auto to 4
#               (metrics compared step by step), LoRA + KL, mixed_precision bf16 over fp32 weights, `grpo eval`
# floors        bench/floors.py: the GPU's read bandwidth and bf16 matmul throughput, and the floors of the vs-trl shape
# vs-trl        bench/vs_trl.py on a random Qwen2.5-0.5B-shaped model, bf16, 64 and 128 new tokens (NEW_TOKENS); it
#               ends with each phase against its floor (issue 40)
# train-memory  bench/train_memory.py: step time and CUDA peak of full / full + KL / LoRA + KL, bf16
# doctor-memory bench/doctor_memory.py --no-server --trace: grpo doctor's memory plan against the CUDA peak, full and
#               LoRA, fp32 and bf16 autocast, short and long prompts (issue 35: within 10%), what is alive at each peak
# attention     bench/attention_decode.py: transformers' sdpa against sdpa_grouped (no repeated keys/values) on the
#               Qwen2.5-0.5B shape (14 query heads on 2 key/value heads): generate and a forward + backward
# compiled      bench/vs_trl.py at 64 tokens with rollout.compile=true (static cache + CUDA graphs) against TRL,
#               then the same with rollout.compile=false and train.chunked_lm_head=false (eager, logits whole)
# goal          issue 23's goal row: B=16, G=8, 256 new tokens, bf16, grpo with rollout.compile=auto
# chunked-head  bench/chunked_head_check.py: the chunked LM head's log-probs and gradients against the plain head's on
#               CUDA's kernels (tied and untied, fp32 and bf16, two micro-batches), and its time on Qwen2.5-0.5B's head
# memory-options issue 40 item 3: bench/vs_trl.py with fewer bytes per parameter on grpo's side (bitsandbytes' 8-bit
#               moments, alone and with recomputation + the chunked LM head; Adafactor), TRL at its defaults
# layouts       issue 38: `grpo train` of ci-tiny in fp32 on the GPU with train.mini_batches=2, mu=2, beta=0.04, padded
#               and with train.packing (per-step metrics compared)
# colocate      issue 38: `grpo train --num-processes 2` with a colocated vLLM engine in each process (tp 1), then one
#               engine split over both (rollout.vllm.tensor_parallel_size=2); needs vLLM's CUDA build and 2 GPUs (the
#               lent H100/H200 machines have neither: the part says so and skips)
# packing       issue 38: bench/packing.py --check (packed = padded on CUDA's kernels, fp32; flash attention's varlen
#               path if installed), then the bench on the Qwen2.5-0.5B shape in bf16, prompts 16-512, completions to 1024
# offload       issue 40 item 3: bench/offload_step.py (an AdamW step with its state on the GPU against
#               train.offload_optimizer's, Qwen2.5-0.5B shape, bf16), `grpo train` of ci-tiny in bf16 with the offload
#               (4 steps straight against 2 + --resume auto, and against the state on the GPU), then bench/vs_trl.py
#               with the offload at 64 tokens (B=4) and 256 (B=16), TRL at its defaults
# recompute     issue 40: bench/recompute.py at B=16 x 256 tokens (a micro-batch's forward + backward as grpo and TRL
#               run it, activations kept and recomputed, the up projection recomputed, the model's own norms; profiles of
#               both recomputed rows: where grpo's recomputation spends its time), then bench/vs_trl.py at grpo's
#               defaults at 256 tokens (B=16) and 64 (B=4), and with gradient checkpointing on both sides at 256
# TRL and the packages the GPU image lacks (pydantic, omegaconf, datasets, math-verify, text2num, pint with flexcache
# and flexparser) are expected on PYTHONPATH (see bench/RESULTS.md, "GPU").
set -u
out=${1:?usage: gpu_checks.sh OUT [PARTS...]}
shift
parts=${*:-smoke floors vs-trl train-memory doctor-memory attention compiled goal chunked-head memory-options layouts packing
colocate offload recompute}
mkdir -p "$out"
work=$(mktemp -d)
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # grpo_cli from this checkout, also for bench/*.py
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

part() {  # part NAME SECONDS CMD...
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*"
    local t0=$SECONDS
    timeout "$limit" "$@" >>"$out/$name.log" 2>&1
    local rc=$?
    tail -n "${TAIL:-25}" "$out/$name.log"
    echo "== $name: rc=$rc, $((SECONDS - t0)) s"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$py -c "import torch, transformers, accelerate, peft; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'| transformers', transformers.__version__, '| accelerate', accelerate.__version__, '| peft', peft.__version__); \
import importlib.util as u; print('trl', __import__('trl').__version__ if u.find_spec('trl') else 'absent')"

grpo() { $py -m grpo_cli "$@"; }
compare() {  # compare RUN_A RUN_B: the per-step metrics two runs logged
    $py - "$1" "$2" <<'EOF'
import json, sys
a, b = ([json.loads(l) for l in open(f"{d}/metrics.jsonl")] for d in sys.argv[1:])
keys = ["loss", "reward", "completions/mean_length", "grad_norm", "kl", "entropy"]
assert [m["step"] for m in a] == [m["step"] for m in b], ([m["step"] for m in a], [m["step"] for m in b])
worst = {k: max(abs(x[k] - y[k]) for x, y in zip(a, b)) for k in keys if k in a[0]}
print(f"{sys.argv[1].rsplit('/', 1)[-1]} vs {sys.argv[2].rsplit('/', 1)[-1]}, max |difference| over steps:", worst)
EOF
}

for p in $parts; do
    case $p in
    smoke)
        tiny=(recipes/ci-tiny.yaml model.dtype=bfloat16 train.learning_rate=1e-4)
        part smoke 300 bash -c "
            set -e
            $py -m grpo_cli train ${tiny[*]} -o $work/straight train.max_steps=4
            $py -m grpo_cli train ${tiny[*]} -o $work/resumed train.max_steps=2
            $py -m grpo_cli train ${tiny[*]} -o $work/resumed train.max_steps=4 --resume auto
            $py -m grpo_cli train ${tiny[*]} -o $work/lora train.max_steps=3 model.lora.r=8 algorithm.beta=0.04
            $py -m grpo_cli train recipes/ci-tiny.yaml -o $work/amp train.max_steps=3 train.mixed_precision=bf16
            (cd $work && $py -m grpo_cli eval $work/straight --limit 8)
            grep -h memory/peak_gib $work/straight/metrics.jsonl | tail -1 | cut -c1-400"
        compare "$work/straight" "$work/resumed" 2>&1 | tee -a "$out/smoke.log"
        ;;
    floors)
        part floors 120 $py bench/floors.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 --B 4 --G 8 \
            --micro-batch 8 --new-tokens 64
        ;;
    vs-trl)
        for n in ${NEW_TOKENS:-64 128}; do
            part "vs-trl-$n" 280 $py bench/vs_trl.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 \
                --trl-python "$py" --threads 4 --new-tokens "$n" --B 4 --micro-batch 8 --rounds 2 --steps 3
        done
        ;;
    train-memory)
        part train-memory 240 $py bench/train_memory.py --dtype bfloat16 --steps 3 --new-tokens 64 --threads 4
        ;;
    doctor-memory)
        part doctor-memory 300 $py bench/doctor_memory.py --no-server --trace
        ;;
    attention)
        part attention 200 $py bench/attention_decode.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 \
            --rows 32 --prompt 256 --new-tokens 64 --repeats 3 --threads 4
        ;;
    compiled)
        part compiled-on 300 $py bench/vs_trl.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 \
            --trl-python "$py" --threads 4 --new-tokens 64 --B 4 --micro-batch 8 --rounds 2 --steps 3 \
            --grpo-set rollout.compile=true
        part compiled-off 300 $py bench/vs_trl.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 \
            --trl-python "$py" --threads 4 --new-tokens 64 --B 4 --micro-batch 8 --rounds 1 --steps 3 \
            --grpo-set rollout.compile=false train.chunked_lm_head=false
        ;;
    goal)
        part goal 420 $py bench/vs_trl.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 \
            --trl-python "$py" --threads 4 --new-tokens 256 --B 16 --G 8 --micro-batch 8 --rounds 1 --steps 2 \
            --grpo-set rollout.compile=auto
        ;;
    chunked-head)
        part chunked-head 120 $py bench/chunked_head_check.py --device cuda
        ;;
    memory-options)
        lean=(model.gradient_checkpointing=true train.chunked_lm_head=true)
        vst=($py bench/vs_trl.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 --trl-python "$py" --threads 4
             --micro-batch 8 --rounds 1)
        part mem-8bit-64 240 "${vst[@]}" --new-tokens 64 --B 4 --steps 3 --grpo-set train.optimizer=adamw_8bit
        part mem-8bit-lean-64 240 "${vst[@]}" --new-tokens 64 --B 4 --steps 3 \
            --grpo-set train.optimizer=adamw_8bit "${lean[@]}"
        part mem-8bit-lean-256 300 "${vst[@]}" --new-tokens 256 --B 16 --steps 2 \
            --grpo-set train.optimizer=adamw_8bit "${lean[@]}"
        part mem-adafactor-64 240 "${vst[@]}" --new-tokens 64 --B 4 --steps 3 --grpo-set train.optimizer=adafactor
        ;;
    layouts)
        lay=(recipes/ci-tiny.yaml train.mini_batches=2 algorithm.num_iterations=2 algorithm.beta=0.04
             train.micro_batch_size=2 train.max_steps=3 train.learning_rate=1e-2 rollout.max_completion_length=24)
        part layouts 240 bash -c "
            set -e
            $py -m grpo_cli train ${lay[*]} -o $work/padded
            $py -m grpo_cli train ${lay[*]} -o $work/packed train.packing=true"
        compare "$work/padded" "$work/packed" 2>&1 | tee -a "$out/layouts.log"
        ;;
    packing)
        part packing-check 120 $py bench/packing.py --check --device cuda
        part packing 300 $py bench/packing.py --shape qwen2.5-0.5b --device cuda --dtype bfloat16 --B 8 --G 8 \
            --prompt-max 512 --new-tokens 1024 --micro-batch 8 --repeat 3
        ;;
    colocate)
        gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
        if ! $py -c "import vllm" 2>/dev/null || [ "$gpus" -lt 2 ]; then
            echo "== colocate: skipped (vllm importable: $($py -c 'import vllm' 2>/dev/null && echo yes || echo no), GPUs: $gpus; needs vLLM and 2)"
        else
            col=(recipes/ci-tiny.yaml rollout.backend=vllm rollout.vllm.mode=colocate train.max_steps=3
                 train.learning_rate=5e-2 rollout.vllm.gpu_memory_utilization=0.2)
            part colocate 400 bash -c "
                set -e
                $py -m grpo_cli train ${col[*]} --num-processes 2 -o $work/colo-tp1
                $py -m grpo_cli train ${col[*]} --num-processes 2 -o $work/colo-tp2 rollout.vllm.tensor_parallel_size=2
                grep -ho '\"sampling/sampling_logp_difference/max\": [0-9.e-]*' $work/colo-tp1/metrics.jsonl $work/colo-tp2/metrics.jsonl"
        fi
        ;;
    offload)
        part offload-step 120 $py bench/offload_step.py --device cuda --dtype bfloat16 --threads 4
        off=(recipes/ci-tiny.yaml model.dtype=bfloat16 train.learning_rate=1e-4)
        part offload-smoke 240 bash -c "
            set -e
            $py -m grpo_cli train ${off[*]} -o $work/on-gpu train.max_steps=4 train.offload_optimizer=false
            $py -m grpo_cli train ${off[*]} -o $work/offloaded train.max_steps=4 train.offload_optimizer=true
            $py -m grpo_cli train ${off[*]} -o $work/off-resumed train.max_steps=2 train.offload_optimizer=true
            $py -m grpo_cli train ${off[*]} -o $work/off-resumed train.max_steps=4 train.offload_optimizer=true --resume auto"
        compare "$work/offloaded" "$work/off-resumed" 2>&1 | tee -a "$out/offload-smoke.log"
        compare "$work/on-gpu" "$work/offloaded" 2>&1 | tee -a "$out/offload-smoke.log"
        vst=($py bench/vs_trl.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 --trl-python "$py" --threads 4
             --micro-batch 8 --rounds 1 --grpo-set train.offload_optimizer=true)
        part offload-64 240 "${vst[@]}" --new-tokens 64 --B 4 --steps 3
        part offload-256 300 "${vst[@]}" --new-tokens 256 --B 16 --steps 2
        ;;
    recompute)
        part recompute 200 $py bench/recompute.py --device cuda --dtype bfloat16 --B 16 --new-tokens 256 --repeat 2 \
            --threads 4 --profile "grpo, recomputed" "transformers, recomputed"
        vst=($py bench/vs_trl.py --model qwen2.5-0.5b --device cuda --dtype bfloat16 --trl-python "$py" --threads 4
             --micro-batch 8 --rounds 1)
        part recompute-defaults-256 300 "${vst[@]}" --new-tokens 256 --B 16 --steps 2
        part recompute-defaults-64 200 "${vst[@]}" --new-tokens 64 --B 4 --steps 3
        part recompute-matched-256 300 "${vst[@]}" --new-tokens 256 --B 16 --steps 2 --gradient-checkpointing on
        ;;
    *) echo "unknown part $p" ;;
    esac
done
rm -rf "$work"
