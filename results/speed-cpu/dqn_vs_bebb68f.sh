#!/bin/bash
# dqn_atari now (HEAD) against the same file at bebb68f, the commit before the run harness that an
# earlier measurement on another machine put at 1.47x CleanRL, alternated on a quiet machine
# (a running sweep's processes stopped with SIGSTOP meanwhile). Needs `git worktree add
# /work/wt_bebb bebb68f`. Rounds 1-2: HEAD, bebb68f; round 3 adds CleanRL first (CLEANRL=1).
# Same commands as cleanrl_vs_ours.sh; both checkouts run in the main venv.
out=/work/timing/bebb; mkdir -p $out
run() { (cd $2 && . /work/main/.venv/bin/activate && /usr/bin/time -f "%e" -o $out/$1.time python algos/dqn_atari.py --total-steps 30000 --buffer-size 100000 --learning-starts 1000 --eval-episodes 1 --checkpoint-interval 0 --eval-interval 0 --device cpu --run-dir $out/$1 > $out/$1.log 2>&1; python -c "import json;print('$1', round(json.load(open('$out/$1/summary.json'))['sps'],1), open('$out/$1.time').read().strip())"); }
theirs() { (cd /work/cleanrl && . .venv/bin/activate && PYTHONPATH=. /usr/bin/time -f "%e" -o $out/$1.time python run.py cleanrl/dqn_atari.py --total-timesteps 30000 --buffer-size 100000 --learning-starts 1000 --no-cuda > $out/$1.log 2>&1; echo $1 $(grep -o "SPS: [0-9]*" $out/$1.log | tail -1) $(cat $out/$1.time)); }
pkill -STOP -f "^python -m benchmark full"; pkill -STOP -f "^/work/main/.venv/bin/python algos/"
trap 'pkill -CONT -f "^/work/main/.venv/bin/python algos/"; pkill -CONT -f "^python -m benchmark full"' EXIT
for r in ${ROUNDS:-1 2}; do
  [ -n "$CLEANRL" ] && theirs clean_$r
  run head_$r /work/main
  run bebb_$r /work/wt_bebb
done
