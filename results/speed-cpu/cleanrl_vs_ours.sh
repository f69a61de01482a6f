#!/bin/bash
# ppo_atari and dqn_atari against CleanRL fe8d8a0 (own venv: gymnasium 0.29.1, ale-py 0.9.1,
# torch 2.13.0+cpu), back to back, alternating, Breakout, defaults; OpenMP left at its default.
out=/work/timing/cleanrl; mkdir -p $out
ours() { (cd /work/main && . .venv/bin/activate && /usr/bin/time -f "%e" -o $out/$1.time python algos/$2 ${@:3} --eval-episodes 1 --checkpoint-interval 0 --eval-interval 0 --device cpu --run-dir $out/$1 > $out/$1.log 2>&1; python -c "import json;print('$1', round(json.load(open('$out/$1/summary.json'))['sps'],1), open('$out/$1.time').read().strip())"); }
theirs() { (cd /work/cleanrl && . .venv/bin/activate && PYTHONPATH=. /usr/bin/time -f "%e" -o $out/$1.time python run.py cleanrl/$2 ${@:3} --no-cuda > $out/$1.log 2>&1; echo $1 $(grep -o "SPS: [0-9]*" $out/$1.log | tail -1) $(cat $out/$1.time)); }
for r in 1 2; do
  ours ppo_ours_$r ppo_atari.py --total-steps 40960
  theirs ppo_clean_$r ppo_atari.py --total-timesteps 40960
done
for r in 1 2; do
  ours dqn_ours_$r dqn_atari.py --total-steps 30000 --buffer-size 100000 --learning-starts 1000
  theirs dqn_clean_$r dqn_atari.py --total-timesteps 30000 --buffer-size 100000 --learning-starts 1000
done
