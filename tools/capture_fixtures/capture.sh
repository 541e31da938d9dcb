#!/usr/bin/env bash
# Re-run every capture of tests/fixtures/real (see its README.md) and write the scrubbed files to OUT_DIR.
#
#   tools/capture_fixtures/capture.sh OUT_DIR
#
# CPU only, no downloads (random-init tiny models, synthetic ids). Needs torch + transformers
# (+ accelerate) in $PYTHON (default: <repo>/.venv/bin/python, else python3), gcc (inductor) and
# util-linux `script` (the tty capture). About 5 minutes on 2 cores; the compile captures dominate.
# The commands run one after the other, never in parallel: the step times are part of the captures.
#
# Each command runs from a fresh staging folder (mktemp -d) that holds `scripts` -> this folder and
# writes its raw output under `raw/`; every raw file then goes through scrub.py into OUT_DIR, which
# replaces the machine paths: staging/raw -> <raw>, trainer output dir -> <run_dir>, inductor caches
# -> <inductor_cache>, venv -> <venv>, base Python -> <python>, staging folder -> <fixtures>.
# KEEP_RAW=1 keeps the staging folder (its path is printed).
# ONLY="13 14 ..." runs only the numbered steps listed (the numbers of the comments below, e.g.
# ONLY="13 14 15 16 17 18 19 20 21" for the captures added 2026-12-03, ONLY="22" for the death_* ones);
# versions.txt is always written.
#
# Do not overwrite tests/fixtures/real with the output without re-checking the tests: several
# assertions are calibrated on the captures of 2026-11-30 (counts, line numbers, digests).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON="$(command -v python3)"; fi
fi
VENV="$("$PYTHON" -c 'import sys; print(sys.prefix)')"
BASE="$("$PYTHON" -c 'import sys; print(sys.base_prefix)')"
"$PYTHON" -c 'import torch, transformers, accelerate' # fail early, before any capture

STAGE="$(mktemp -d "${TMPDIR:-/tmp}/stepwatch-capture.XXXXXX")"
if [ "${KEEP_RAW:-0}" = 1 ]; then
    echo "staging folder kept: $STAGE"
else
    trap 'rm -rf "$STAGE"' EXIT
fi
ln -s "$HERE" "$STAGE/scripts"
mkdir "$STAGE/raw"
RAW="$STAGE/raw"
RUN_DIR="$STAGE/run_dir"
cd "$STAGE"
unset TORCH_LOGS TORCHINDUCTOR_CACHE_DIR # set per command below, as in the original commands

want() { # want N: true if step N is to run (every step when ONLY is unset or empty)
    [ -z "${ONLY:-}" ] && return 0
    case " $ONLY " in *" $1 "*) return 0 ;; esac
    return 1
}
fresh_run_dir() { rm -rf "$RUN_DIR"; mkdir "$RUN_DIR"; }
new_cache() { local d="$STAGE/inductor_cache_$1"; rm -rf "$d"; mkdir "$d"; echo "$d"; }
T_ALL=$SECONDS
step() { # step NAME: prints the name and, on the next call/finish, the seconds the previous one took
    if [ -n "${_STEP:-}" ]; then echo "  $_STEP: $((SECONDS - _T0)) s"; fi
    _STEP="$1"; _T0=$SECONDS
    [ -n "$1" ] && echo "capture: $1 ..."
    return 0
}

# 1. HF Trainer, 60 steps, stdout+stderr to a file (not a TTY)
if want 1; then
step hf_trainer_plain.log
fresh_run_dir
"$PYTHON" scripts/hf_trainer_run.py --out-dir "$RUN_DIR" --steps 60 > "$RAW/hf_trainer_plain.log" 2>&1 </dev/null
fi

# 2. the same under a pseudo-TTY of 120 columns (script's own stdin is not a terminal, as in the original)
if want 2; then
step hf_trainer_tty.log
fresh_run_dir
script -q -c "stty cols 120 rows 40; $(printf %q "$PYTHON") scripts/hf_trainer_run.py --out-dir $(printf %q "$RUN_DIR") --steps 60" \
    "$RAW/hf_trainer_tty.log" </dev/null >/dev/null 2>&1
fi

# 3. a bigger model: ~1.5 s steps, the s/it form
if want 3; then
step hf_trainer_slow.log
fresh_run_dir
"$PYTHON" scripts/hf_trainer_run.py --out-dir "$RUN_DIR" --steps 20 --logging-steps 5 --hidden 320 --layers 4 \
    --seq-len 512 > "$RAW/hf_trainer_slow.log" 2>&1 </dev/null
fi

# 4. torch_compile=True, variable-length padded batches, cold inductor cache
if want 4; then
step hf_trainer_compile.log
fresh_run_dir
CACHE="$(new_cache compile)"
TORCHINDUCTOR_CACHE_DIR="$CACHE" TORCH_LOGS="recompiles,graph_breaks" "$PYTHON" scripts/hf_trainer_run.py \
    --out-dir "$RUN_DIR" --steps 40 --compile --varlen --batch 4 --shape-log "$RAW/hf_trainer_compile_shapes.txt" \
    > "$RAW/hf_trainer_compile.log" 2>&1 </dev/null
fi

# 5. callback API facts + PrinterCallback output (disable_tqdm=True, checkpoint saves at 6 and 12)
if want 5; then
step "trainer_api_facts.json + hf_trainer_printer_callback.log"
fresh_run_dir
"$PYTHON" scripts/trainer_api_facts.py --out-dir "$RUN_DIR" --json "$RAW/trainer_api_facts.json" \
    > "$RAW/hf_trainer_printer_callback.log" 2>&1 </dev/null
fi

# 6. torch.compile(dynamic=False) into recompile_limit=4, with TORCH_LOGS, cold cache
if want 6; then
step "dynamo_recompiles.log + dynamo_step_times.csv + dynamo_counters.json"
CACHE="$(new_cache recompiles)"
TORCHINDUCTOR_CACHE_DIR="$CACHE" TORCH_LOGS="recompiles,graph_breaks" "$PYTHON" scripts/dynamo_recompile.py \
    --csv "$RAW/dynamo_step_times.csv" --counters "$RAW/dynamo_counters.json" 2> "$RAW/dynamo_recompiles.log" >/dev/null </dev/null
fi

# 7. the same without TORCH_LOGS, cold cache (its counters are not kept)
if want 7; then
step "dynamo_limit_default.log + dynamo_step_times_default.csv"
WARM="$(new_cache default)"
env -u TORCH_LOGS TORCHINDUCTOR_CACHE_DIR="$WARM" "$PYTHON" scripts/dynamo_recompile.py \
    --csv "$RAW/dynamo_step_times_default.csv" --counters "$STAGE/counters_default_not_kept.json" \
    2> "$RAW/dynamo_limit_default.log" >/dev/null </dev/null
fi

# 8. again on the cache left by 7 (warm): counters and step times only (its stderr is not kept)
if want 8; then
step "dynamo_counters_warmcache.json + dynamo_step_times_warmcache.csv"
: "${WARM:?step 8 needs step 7 (ONLY=\"7 8\")}"
env -u TORCH_LOGS TORCHINDUCTOR_CACHE_DIR="$WARM" "$PYTHON" scripts/dynamo_recompile.py \
    --csv "$RAW/dynamo_step_times_warmcache.csv" --counters "$RAW/dynamo_counters_warmcache.json" \
    2> "$STAGE/warmcache_stderr_not_kept.log" >/dev/null </dev/null
fi

# 9. per-line append+flush cost (a temp file on the staging folder's filesystem)
if want 9; then
step append_cost.json
"$PYTHON" scripts/append_cost.py --file "$STAGE/append_cost.tmp" --json "$RAW/append_cost.json" >/dev/null </dev/null
fi

# 10b. torchrun, 2 ranks on gloo, rank 1 SIGKILLs itself at step 30: torchrun's failure table
if want 10b; then
step torchrun_sigkill_rank1.log
"$VENV/bin/torchrun" --nproc_per_node 2 scripts/torchrun_ddp.py --steps 100 --kill-rank 1 --kill-at 30 \
    > "$RAW/torchrun_sigkill_rank1.log" 2>&1 </dev/null || true
fi

# 11. PyTorch Lightning, TQDM bar and Rich bar (Rich told to draw into the file, as the supervisor does)
if want 11; then
step "lightning_tqdm.log + lightning_rich.log"
"$PYTHON" scripts/lightning_run.py > "$RAW/lightning_tqdm.log" 2>&1 </dev/null
TTY_COMPATIBLE=1 TTY_INTERACTIVE=1 "$PYTHON" scripts/lightning_run.py --rich > "$RAW/lightning_rich.log" 2>&1 </dev/null
fi

# 12. karpathy/nanoGPT's train.py (a checkout named by $NANOGPT_DIR), tiny, CPU, synthetic data
if want 12; then
if [ -n "${NANOGPT_DIR:-}" ]; then
    step nanogpt_cpu.log
    mkdir -p "$STAGE/nanogpt/data" && cp "$NANOGPT_DIR"/{train,model,configurator}.py "$STAGE/nanogpt/"
    "$PYTHON" scripts/nanogpt_data.py "$STAGE/nanogpt/data/synth"
    (cd "$STAGE/nanogpt" && OMP_NUM_THREADS=1 "$PYTHON" train.py --dataset=synth --device=cpu --compile=False \
        --dtype=float32 --eval_iters=5 --eval_interval=20 --log_interval=1 --block_size=64 --batch_size=8 \
        --n_layer=2 --n_head=2 --n_embd=64 --max_iters=50 --lr_decay_iters=50 --dropout=0.0 \
        --gradient_accumulation_steps=1 --always_save_checkpoint=False --out_dir=out) \
        > "$RAW/nanogpt_cpu.log" 2>&1 </dev/null
fi
fi

# 13. plain PyTorch loop, tqdm bar with desc "train" and set_postfix(loss=...) every step, 100 x 50 ms,
#     with the program's own step-end clock (time.time() after each step)
if want 13; then
step "tqdm_desc_postfix.log + tqdm_desc_postfix_clock.txt"
"$PYTHON" scripts/tqdm_loop.py --steps 100 --sleep 0.05 --clock "$RAW/tqdm_desc_postfix_clock.txt" \
    > "$RAW/tqdm_desc_postfix.log" 2>&1 </dev/null
fi

# 14. the same loop, 3 epochs, one bar per epoch (desc "Epoch {e}", counter restarts at 0/40)
if want 14; then
step "tqdm_epochs.log + tqdm_epochs_clock.txt"
"$PYTHON" scripts/tqdm_loop.py --epochs 3 --steps 40 --sleep 0.05 --clock "$RAW/tqdm_epochs_clock.txt" \
    > "$RAW/tqdm_epochs.log" 2>&1 </dev/null
fi

# 15. two processes, each an unprefixed 300-step "train" bar (20 ms and 30 ms steps), into ONE file
if want 15; then
step "tqdm_two_procs.log + tqdm_two_procs_clock_proc0.txt, _proc1.txt"
"$PYTHON" scripts/tqdm_two_procs.py --steps 300 --sleeps 0.02 0.03 --postfix-every 5 \
    --clock "$RAW/tqdm_two_procs_clock" > "$RAW/tqdm_two_procs.log" 2>&1 </dev/null
fi

# 16. the tqdm loop SIGKILLs itself at the start of step 60 of 100: the log ends in a \r bar segment
if want 16; then
step "tqdm_sigkill.log + tqdm_sigkill_clock.txt"
"$PYTHON" scripts/tqdm_loop.py --steps 100 --sleep 0.05 --kill-at 60 --clock "$RAW/tqdm_sigkill_clock.txt" \
    > "$RAW/tqdm_sigkill.log" 2>&1 </dev/null || true
fi

# 17. Lightning with max_steps and no max_epochs (max_epochs becomes -1): Rich bar (told the file is a
#     terminal), TQDM bar, and Lightning's default bar (no callback; rich installed -> RichProgressBar,
#     here WITHOUT the TTY variables). 100 steps over 40-batch epochs (40 + 40 + 20), and 60 steps
#     ending mid-epoch in 100-batch epochs (_midepoch).
if want 17; then
step "lightning_{rich,tqdm,default}_max_steps*.log + clocks"
TTY_COMPATIBLE=1 TTY_INTERACTIVE=1 "$PYTHON" scripts/lightning_run.py --rich --max-steps 100 \
    --clock "$RAW/lightning_rich_max_steps_clock.txt" > "$RAW/lightning_rich_max_steps.log" 2>&1 </dev/null
"$PYTHON" scripts/lightning_run.py --max-steps 100 --clock "$RAW/lightning_tqdm_max_steps_clock.txt" \
    > "$RAW/lightning_tqdm_max_steps.log" 2>&1 </dev/null
TTY_COMPATIBLE=1 TTY_INTERACTIVE=1 "$PYTHON" scripts/lightning_run.py --rich --max-steps 60 --samples 800 \
    > "$RAW/lightning_rich_max_steps_midepoch.log" 2>&1 </dev/null
"$PYTHON" scripts/lightning_run.py --max-steps 60 --samples 800 \
    > "$RAW/lightning_tqdm_max_steps_midepoch.log" 2>&1 </dev/null
env -u TTY_COMPATIBLE -u TTY_INTERACTIVE "$PYTHON" scripts/lightning_run.py --default-bar --max-steps 100 \
    > "$RAW/lightning_default_max_steps.log" 2>&1 </dev/null
fi

# 18. HF Trainer with disable_tqdm=True, logging_steps=1 (PrinterCallback dicts only), 30 steps over
#     2 epochs (120 samples, batch 8 -> 15 steps per epoch), with an on_step_end clock
if want 18; then
step "hf_trainer_no_tqdm.log + hf_trainer_no_tqdm_clock.txt"
fresh_run_dir
"$PYTHON" scripts/hf_trainer_run.py --out-dir "$RUN_DIR" --steps 30 --samples 120 --logging-steps 1 --disable-tqdm \
    --clock "$RAW/hf_trainer_no_tqdm_clock.txt" > "$RAW/hf_trainer_no_tqdm.log" 2>&1 </dev/null
fi

# 19. HF Trainer under torchrun --tee 3 (2 gloo ranks on the CPU): [default0]:/[default1]: prefixes
#     on every line, tqdm \r segments split into lines by torchrun's tail; 30 steps, a dict every 3
if want 19; then
step torchrun_tee_dicts.log
fresh_run_dir
rm -rf "$STAGE/torchrun_logs"
"$VENV/bin/torchrun" --nproc_per_node 2 --tee 3 --log-dir "$STAGE/torchrun_logs" scripts/hf_trainer_run.py \
    --out-dir "$RUN_DIR" --steps 30 --logging-steps 3 > "$RAW/torchrun_tee_dicts.log" 2>&1 </dev/null
fi

# 20. OUR script printing timm train.py's Train:/Test: lines (timm not installed: see README)
if want 20; then
step "timm_shaped.log + timm_shaped_clock.txt"
"$PYTHON" scripts/timm_shaped.py --epochs 3 --batches 23 --log-interval 5 --sleep 0.05 \
    --clock "$RAW/timm_shaped_clock.txt" > "$RAW/timm_shaped.log" 2>&1 </dev/null
fi

# 21. py-spy dumps (--nonblocking, as the supervisor takes them) of three stuck poses of our
#     stack_poses.py: 3 gloo ranks under torchrun where rank 1 sleeps before its all_reduce (each rank
#     and the launcher), torch.save held on a FIFO, a DataLoader whose worker sleeps in __getitem__
if want 21; then
step "pyspy_gloo3_{rank0,rank1,rank2,launcher}.txt + pyspy_save.txt + pyspy_loader_{main,worker}.txt"
spy() { "$VENV/bin/py-spy" dump --pid "$1" --nonblocking > "$RAW/$2" 2>&1 || true; }
"$VENV/bin/torchrun" --nproc_per_node 3 scripts/stack_poses.py gloo > "$STAGE/gloo3.log" 2>&1 </dev/null &
LAUNCHER=$!
sleep 12  # rank 1 sleeps from about 2 s + 20 x 0.1 s on
for pid in $(pgrep -P "$LAUNCHER"); do
    r=$(tr '\0' '\n' < "/proc/$pid/environ" | sed -n 's/^RANK=//p')
    spy "$pid" "pyspy_gloo3_rank$r.txt"
done
spy "$LAUNCHER" pyspy_gloo3_launcher.txt
kill "$LAUNCHER"; wait "$LAUNCHER" 2>/dev/null || true
rm -f "$STAGE/fifo"
"$PYTHON" scripts/stack_poses.py save "$STAGE/fifo" > /dev/null 2>&1 </dev/null &
SAVER=$!
sleep 6; spy "$SAVER" pyspy_save.txt; kill "$SAVER"; wait "$SAVER" 2>/dev/null || true
"$PYTHON" scripts/stack_poses.py loader > /dev/null 2>&1 </dev/null &
LOADER=$!
sleep 8; spy "$LOADER" pyspy_loader_main.txt
for pid in $(pgrep -P "$LOADER"); do  # the worker asleep in __getitem__ (the other waits for work)
    grep -q "__getitem__" <("$VENV/bin/py-spy" dump --pid "$pid" --nonblocking 2>&1) && spy "$pid" pyspy_loader_worker.txt
done
kill "$LOADER"; wait "$LOADER" 2>/dev/null || true
fi

# 22. runs that END in different ways (ours: deaths.py): a callback's ValueError at step 10, an
#     IndexError before the first step, a CPU allocation failure, a gloo all_reduce timeout under
#     torchrun --tee 3, a nan loss (lr 1e6); each exit status into death_exits.json ("signal" from
#     bash's 128+N status). Then save_steps=20 to the end, and SIGKILLed mid-save of checkpoint-40:
#     the listing of both output dirs (the two runs' own logs are not kept)
if want 22; then
step "death_*.log + death_exits.json + hf_checkpoints_save20.json"
EXITS="$STAGE/death_exits.txt"
: > "$EXITS"
died() { # died FILE CMD...: CMD's stdout+stderr into $RAW/FILE, its exit status into $EXITS
    local f="$1" rc=0
    shift
    "$@" > "$RAW/$f" 2>&1 </dev/null || rc=$?
    echo "$f $rc" >> "$EXITS"
}
fresh_run_dir
died death_valueerror_step10.log "$PYTHON" scripts/deaths.py valueerror-at 10 --out-dir "$RUN_DIR"
fresh_run_dir
died death_before_first_step.log "$PYTHON" scripts/deaths.py before-first-step --out-dir "$RUN_DIR"
died death_cpu_oom.log "$PYTHON" scripts/deaths.py cpu-oom
rm -rf "$STAGE/torchrun_logs_gloo"
died death_gloo_timeout.log "$VENV/bin/torchrun" --nproc_per_node 2 --tee 3 --log-dir "$STAGE/torchrun_logs_gloo" \
    scripts/deaths.py gloo-timeout
fresh_run_dir
died death_nan_loss.log "$PYTHON" scripts/deaths.py nan-loss --out-dir "$RUN_DIR"
"$PYTHON" - "$EXITS" "$RAW/death_exits.json" <<'EOF'
import json, signal, sys
exits = {}
for line in open(sys.argv[1]):
    name, rc = line.split()
    rc = int(rc)
    exits[name] = {"returncode": rc, "signal": signal.Signals(rc - 128).name if rc > 128 else None}
with open(sys.argv[2], "w") as f:
    json.dump(exits, f, indent=2)
    f.write("\n")
EOF
fresh_run_dir
"$PYTHON" scripts/deaths.py save-steps --out-dir "$RUN_DIR" --json "$RAW/hf_checkpoints_save20.json" \
    --logs-dir "$STAGE" > "$STAGE/save_steps_driver.log" 2>&1 </dev/null
fi

# 10. exact package versions of the venv used (the editable stepwatch itself left out)
step versions.txt
"$PYTHON" -m pip freeze --exclude-editable | grep -v " @ file://" > "$RAW/versions.txt"
step ""

# scrub: innermost paths first; <fixtures> (the staging folder) last
MAPS=(--path "$RAW=<raw>" --path "$RUN_DIR=<run_dir>" --map "$(printf '%s' "$STAGE" | sed 's/[][\.*^$+?(){}|]/\\&/g')/inductor_cache_[a-z]+=<inductor_cache>"
      --path "$HERE=<fixtures>/scripts" --path "$VENV=<venv>" --path "$BASE=<python>" --path "$STAGE=<fixtures>")
for f in "$RAW"/*; do
    "$PYTHON" "$HERE/scrub.py" "$f" "$OUT/$(basename "$f")" "${MAPS[@]}"
done
echo "done: $(ls "$OUT" | wc -l) files in $OUT, $((SECONDS - T_ALL)) s in all"
