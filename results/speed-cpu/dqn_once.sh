#!/bin/bash
source <(sed -n '/^out=/,/^theirs()/p' /work/timing/cleanrl_vs_ours.sh)
ours dqn_ours_3 dqn_atari.py --total-steps 30000 --buffer-size 100000 --learning-starts 1000
theirs dqn_clean_3 dqn_atari.py --total-timesteps 30000 --buffer-size 100000 --learning-starts 1000
