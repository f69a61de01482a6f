#!/bin/bash
# dqn_atari against CleanRL, two more rounds back to back on a quiet machine (ours, theirs, ours,
# theirs): the same commands and helpers as cleanrl_vs_ours.sh.
source <(sed -n '/^out=/,/^theirs()/p' "$(dirname "$0")/cleanrl_vs_ours.sh")
for r in 4 5; do
  ours dqn_ours_$r dqn_atari.py --total-steps 30000 --buffer-size 100000 --learning-starts 1000
  theirs dqn_clean_$r dqn_atari.py --total-timesteps 30000 --buffer-size 100000 --learning-starts 1000
done
