#!/usr/bin/env bash
# CAT on Qwen3-8B, end to end: carve a FRAMES train split, K=4 sampled teacher attempts per
# training task, RFT (LoRA), K=4 sampled attempts of the RFT model, trajectory-level KTO, then
# the student, RFT and KTO models on the held-out questions (greedy). Every step resumes: rerun
# the same command after an interruption. docs/training.md explains each step.
#
#   MODEL=/models/Qwen3-8B TEACHER=openai:Qwen/Qwen3-235B-A22B@http://teacher:8000/v1 \
#   JUDGE=openai:Qwen/Qwen3-235B-A22B@http://teacher:8000/v1 SEARCH=searxng SEARX_HOST=http://searx:8080 \
#   FRAMES=data/frames/test.tsv scripts/cat-qwen3.sh
#
# Optional: OUT (runs/cat-qwen3), SEED (0), FRAMES_TRAIN (300 questions for training, the rest
# held out), CONCURRENCY (32), LAUNCH (a launcher for the two training commands, which runs
# them as `$LAUNCH -m toolself train ...`: "accelerate launch --config_file CONFIG" with one of
# toolself/train/accelerate/*.yaml, or "torchrun --nproc_per_node 8"), VLLM (vllm: the
# command that serves the RFT and KTO adapters with --enable-lora, one server at a time; without
# it the adapters run in toolself's own engine, `local:DIR`), VLLM_PORT (8001, and the next).
#
# CAT_MINIATURE=1 runs the same steps on the built-in research suite with the expert teacher
# and MODEL a tiny model directory (toolself.train.shapes), on a CPU: CI runs it so that this
# script cannot rot.
set -euo pipefail

die() { echo "cat-qwen3: $*" >&2; exit 2; }

OUT=${OUT:-runs/cat-qwen3}
SEED=${SEED:-0}
TOOLSELF=${TOOLSELF:-toolself}  # e.g. "python -m toolself"
PYTHON=${PYTHON:-python3}
MODEL=${MODEL:-}
[ -n "$MODEL" ] || die "set MODEL to the student's model directory (e.g. /models/Qwen3-8B)"
[ -f "$MODEL/config.json" ] || die "MODEL=$MODEL holds no config.json: not a transformers model directory"
# Rejection sampling draws K attempts per task: they must differ, so collections sample.
TEMPERATURE=0.7
REPEATS=4

if [ "${CAT_MINIATURE:-0}" = 1 ]; then
  TEACHER=expert
  TRAIN_TASKS="builtin:research?hops=2"; TEST_TASKS="builtin:research?hops=2"
  TRAIN_SPLIT=train; TEST_SPLIT=heldout
  REPEATS=2; CONCURRENCY=${CONCURRENCY:-2}
  EVAL_ARGS=(--limit 1 --max-stages 3 --max-steps 4 --max-tokens 8000 --timeout 300)
  RFT_ARGS=(--max-steps 1 --batch-size 2 --grad-accum 1 --max-length 512)
  KTO_ARGS=(--max-steps 1 --batch-size 2 --grad-accum 1 --max-length 512)
  VLLM=${VLLM:-}  # none: toolself's engine; CI passes a stand-in that serves as `vllm serve` does
else
  TEACHER=${TEACHER:-}
  [ -n "$TEACHER" ] || die "set TEACHER=openai:NAME@URL, the teacher's OpenAI-compatible server (the paper: Qwen3-235B)"
  [ -n "${FRAMES:-}" ] || die "set FRAMES to the FRAMES file (the frames-benchmark test.tsv); a train split is carved from it"
  [ -f "$FRAMES" ] || die "FRAMES=$FRAMES does not exist"
  [ -n "${JUDGE:-}" ] || die "FRAMES answers are free text, scored by an LLM judge: set JUDGE=openai:NAME@URL"
  [ -n "${SEARCH:-}" ] || die "FRAMES questions are answered from the web: set SEARCH=searxng|serper|tavily|brave|jina and its variable (SEARX_HOST, SERPER_API_KEY, TAVILY_API_KEY, BRAVE_API_KEY or JINA_API_KEY)"
  $PYTHON -m toolself.train.splits "$FRAMES" --train "${FRAMES_TRAIN:-300}" --seed "$SEED" --name frames \
      --out "$OUT/data" >/dev/null
  TRAIN_TASKS="frames:$OUT/data/frames_train.tsv"; TEST_TASKS="frames:$OUT/data/frames_test.tsv"
  TRAIN_SPLIT=train; TEST_SPLIT=test
  CONCURRENCY=${CONCURRENCY:-32}
  EVAL_ARGS=(--judge "$JUDGE" --search "$SEARCH")
  RFT_ARGS=(--max-length 16384 --batch-size 2 --grad-accum 4 --epochs 2)
  KTO_ARGS=(--max-length 16384 --batch-size 4 --grad-accum 2)
  VLLM=${VLLM-vllm}
  if [ -n "$VLLM" ] && ! command -v "$VLLM" >/dev/null; then
    echo "cat-qwen3: $VLLM not found: the adapters run in toolself's own engine (local:DIR)" >&2
    VLLM=""
  fi
fi
LAUNCH=${LAUNCH:-}
if [ -n "$LAUNCH" ]; then
  # torchrun (accelerate launch runs it) passes on only the signals it handles, and dies of any
  # other: add SIGUSR1, which Slurm sends ahead of a time limit (--signal=USR1@90), so that the
  # run saves a checkpoint and stops; and wait for that longer than its 30 s (torch 2.13 reads it).
  export PET_SIGNALS_TO_HANDLE=${PET_SIGNALS_TO_HANDLE:-SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1}
  export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-90}
fi
PORT=${VLLM_PORT:-8001}  # the RFT server's; the KTO server's is the next one

# A stop signal sent to this script alone (a container's first process, a batch script) goes on
# to the command it is running, which saves what it did and exits with the line that resumes it;
# the script then exits with that command's status. Outside a command, the script just exits.
# A command runs in the background so that the script can pass signals on while it waits; such
# a command ignores SIGINT, so Ctrl-C reaches it as SIGTERM, which toolself takes as Ctrl-C.
RUNNING=""
pass_on() {  # pass_on SIGNAL STATUS
  if [ -n "$RUNNING" ]; then
    kill -s "$1" "$RUNNING" 2>/dev/null || true
  else
    exit "$2"
  fi
}
trap 'pass_on TERM 143' TERM
trap 'pass_on USR1 138' USR1
trap 'pass_on TERM 130' INT

run() {  # run COMMAND...: run it, passing stop signals on, and return its status
  "$@" &
  RUNNING=$!
  local status
  while :; do
    status=0
    wait "$RUNNING" || status=$?
    kill -0 "$RUNNING" 2>/dev/null || break  # else a signal ended the wait, not the command
  done
  if [ "$status" -gt 128 ]; then  # the command may have ended as the signal came: its own status
    wait "$RUNNING" 2>/dev/null && status=0 || { local again=$?; [ "$again" = 127 ] || status=$again; }
  fi
  RUNNING=""
  return "$status"
}

train() {  # train rft|kto ARGS...: in one process, or in the processes $LAUNCH starts (accelerate
  # launch and torchrun run a module with -m; given a command name they would look for a file)
  if [ -n "$LAUNCH" ]; then
    run $LAUNCH -m toolself train "$@"
  else
    run $TOOLSELF train "$@"
  fi
}

# The student, RFT and KTO models decode as their training data renders a reply: without
# reasoning, since the default protocol keeps none of the teacher's. Served by vLLM, Qwen3 is
# asked not to think (toolself's own engine never does); the teacher thinks as its server has it.
NO_THINKING='{"chat_template_kwargs": {"enable_thinking": false}}'

collect() {  # collect NAME MODEL TASKS SPLIT TEMPERATURE REPEATS [student]
  local request=()
  [ "${7:-}" = student ] && [ "${2#openai:}" != "$2" ] && request=(--request-options "$NO_THINKING")
  run $TOOLSELF eval --model "$2" --tasks "$3" --split "$4" --temperature "$5" --repeats "$6" --seed "$SEED" \
      --concurrency "$CONCURRENCY" "${EVAL_ARGS[@]}" ${request[@]+"${request[@]}"} --no-report --out "$OUT/$1"
}

# A vLLM server holds most of its GPU's memory (--gpu-memory-utilization, 0.9) for as long as it
# runs: each one is stopped before the next server or a training step starts, and all of them
# when this script ends. Each runs in a session of its own, so that stopping it stops the engine
# processes it started too.
trap 'for f in "$OUT"/vllm-*.pid; do [ -f "$f" ] && stop "$(basename "$f" .pid | sed s/^vllm-//)"; done' EXIT

up() {  # up URL: whether an OpenAI-compatible server answers there
  $PYTHON -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/models", timeout=5)' "$1" \
      2>/dev/null
}

serve() {  # serve NAME BASE ADAPTER PORT [BASE_NAME]: start vLLM with the adapter, the base served
  # as BASE_NAME (default: base); SERVED is then the adapter's model spec. In this shell, not in a
  # $(...) one, so that a stop signal while vLLM starts ends the script (and the server) at once.
  if [ -z "$VLLM" ]; then
    SERVED="local:$3"
    return
  fi
  local url="http://127.0.0.1:$4/v1" rank
  if ! { [ -f "$OUT/vllm-$1.pid" ] && kill -0 "$(cat "$OUT/vllm-$1.pid")" 2>/dev/null; }; then
    up "$url" && die "port $4 is taken by another server: stop it, or free the port"
    # vLLM takes a --max-lora-rank of 1, 8, 16, 32 ... 512 only: the smallest that holds the rank
    rank=$($PYTHON -c 'import json, sys; from toolself.train.served import max_lora_rank
print(max_lora_rank(json.load(open(sys.argv[1]))["r"]))' "$3/adapter_config.json")
    setsid "$VLLM" serve "$2" --enable-lora --max-lora-rank "$rank" --lora-modules "$1=$3" \
        --served-model-name "${5:-base}" --port "$4" \
        >"$OUT/vllm-$1.log" 2>&1 </dev/null &
    echo $! >"$OUT/vllm-$1.pid"
  fi
  for _ in $(seq 600); do
    up "$url" && break
    kill -0 "$(cat "$OUT/vllm-$1.pid")" 2>/dev/null || die "vLLM exited while starting: see $OUT/vllm-$1.log"
    sleep 2
  done
  up "$url" || die "vLLM did not come up on port $4: see $OUT/vllm-$1.log"
  SERVED="openai:$1@$url"
}

stop() {  # stop NAME: stop the server `serve NAME` started and wait until it has let go of its GPU
  local f="$OUT/vllm-$1.pid" pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 120); do
    kill -0 -- "-$pid" 2>/dev/null || break
    sleep 1
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$f"
}

mkdir -p "$OUT"
echo "== 1. teacher: $REPEATS attempts per training task at temperature $TEMPERATURE"
collect teacher "$TEACHER" "$TRAIN_TASKS" "$TRAIN_SPLIT" "$TEMPERATURE" "$REPEATS"

echo "== 2. RFT of $MODEL on the teacher's successes"
# Run on every rerun: a finished RFT says so and trains nothing, and records where MODEL is
# mounted now (a job resumed on another node), for KTO's merge and the local engine
train rft --trajectories "$OUT/teacher" --student "$MODEL" --out "$OUT/rft" --seed "$SEED" \
    --resume "${RFT_ARGS[@]}"

echo "== 3. the RFT model: $REPEATS attempts per training task at temperature $TEMPERATURE"
serve rft "$MODEL" "$OUT/rft" "$PORT" student
RFT=$SERVED
collect policy "$RFT" "$TRAIN_TASKS" "$TRAIN_SPLIT" "$TEMPERATURE" "$REPEATS" student
stop rft

echo "== 4. trajectory-level KTO on the RFT model's attempts"
# train_result.json is written after the whole model: a step killed before it trains again,
# from its last checkpoint
[ -f "$OUT/kto/train_result.json" ] || \
  train kto --policy "$OUT/rft" --trajectories "$OUT/policy" --out "$OUT/kto" --seed "$SEED" \
      --resume "${KTO_ARGS[@]}"

echo "== 5. student, RFT and KTO on the held-out questions (greedy)"
serve rft "$MODEL" "$OUT/rft" "$PORT" student
RFT=$SERVED
# The RFT server's base, by a name and not by MODEL's path, which a job resumed on another node
# may have mounted elsewhere; step 2 has refused another model by its digest
STUDENT="local:$MODEL"
[ -z "$VLLM" ] || STUDENT="openai:student@http://127.0.0.1:$PORT/v1"
collect eval/student "$STUDENT" "$TEST_TASKS" "$TEST_SPLIT" 0 1 student
collect eval/rft "$RFT" "$TEST_TASKS" "$TEST_SPLIT" 0 1 student
stop rft
serve kto "$OUT/kto/base" "$OUT/kto" "$((PORT + 1))"
KTO=$SERVED
collect eval/kto "$KTO" "$TEST_TASKS" "$TEST_SPLIT" 0 1 student
stop kto
run $TOOLSELF report "$OUT/eval/student" "$OUT/eval/rft" "$OUT/eval/kto" --out "$OUT/report"
echo "done: $OUT"
