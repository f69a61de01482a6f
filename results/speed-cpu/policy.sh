#!/bin/bash
# OpenMP wait policy: alone (one job at a time) and beside two others (three at once), default
# torch threads (2 on this machine), steady-state steps/s from `python -m benchmark speed`.
cd /work/main && . .venv/bin/activate
out=/work/timing/policy; mkdir -p $out
run() { # tag policy files...
  local tag=$1 pol=$2; shift 2
  if [ "$pol" = default ]; then env -u OMP_WAIT_POLICY python -m benchmark speed --files "$@" --compile off --repeats 1 --out $out/$tag.json > $out/$tag.log 2>&1
  else OMP_WAIT_POLICY=$pol python -m benchmark speed --files "$@" --compile off --repeats 1 --out $out/$tag.json > $out/$tag.log 2>&1; fi
}
for r in 1 2; do for pol in default ACTIVE PASSIVE; do run alone_${pol}_$r $pol dqn_atari ppo_atari d4pg; done; done
for algo in dqn_atari d4pg ppo_atari; do for pol in default PASSIVE; do
  run beside_${algo}_${pol}_a $pol $algo & run beside_${algo}_${pol}_b $pol $algo & run beside_${algo}_${pol}_c $pol $algo; wait
done; done
echo policy done
