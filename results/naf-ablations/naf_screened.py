"""NAF: continuous Q-learning with Normalized Advantage Functions.

Paper: Shixiang Gu, Timothy Lillicrap, Ilya Sutskever, Sergey Levine, "Continuous Deep
Q-Learning with Model-based Acceleration", ICML 2016, arXiv:1603.00748 (Section 4; the
model-based acceleration of Section 5 is not part of this file).

Idea: Q-learning needs max_u Q(x, u), which has no closed form for continuous actions u.
NAF restricts the advantage to a concave quadratic in u, centred on a learned action mu(x).
Then the greedy action is mu(x) and max_u Q(x, u) = V(x), both read off one network: the
policy needs no separate actor, and the only loss is the TD error of Q (plus, here, deviation g's
small penalty on mu).

Equations (paper, Section 4):
    Q(x, u) = V(x) + A(x, u)
    A(x, u) = -1/2 (u - mu(x))^T P(x) (u - mu(x)),   P(x) = L(x) L(x)^T
    L(x)    lower-triangular, its entries a linear output of the network, diagonal
            exponentiated, so P is positive definite and A <= 0 with A = 0 only at u = mu
    y       = r + gamma (1 - terminated) V'(x')        (V' from the target network; deviation h,
            an option, takes the smaller V' of two networks; j, an option, smooths V')
    loss    = mean_batch (y - Q(x, u))^2,   theta' <- tau theta + (1 - tau) theta'
            (this file adds deviation g's penalty on mu before tanh to the loss)

Implementation details:
1. One MLP trunk (two ReLU layers of `hidden_dim`; deviation i puts a LayerNorm before each ReLU)
   with three linear heads: V (1 value), mu (|A| values through tanh, so mu lies in [-1, 1]^|A|)
   and the |A|(|A|+1)/2 entries of L.
2. The network acts in [-1, 1]^|A|; `scale_action` is the one place that maps to the
   environment's bounds. Exploration noise is added in [-1, 1] space and clipped there.
3. Exploration (the paper's random process N): Gaussian N(0, sigma^2) per step, or
   Ornstein-Uhlenbeck (as in DDPG, theta = 0.15, sigma) whose state restarts at 0 with each
   episode: it is zeroed on the autoreset step (whose action the env ignores), so an episode's
   first action carries exactly one increment. sigma falls linearly from `noise_scale` to
   `final_noise_scale` over the first `noise_decay_steps` steps, then stays (deviation c).
   Uniform random actions for the first `learning_starts` steps.
4. The target masks the bootstrap with `terminated` only: a time-limit truncation keeps
   gamma V'(x') of the real final observation, which Gymnasium's NEXT_STEP autoreset
   returns at the step the episode ends.
5. NEXT_STEP autoreset, handled explicitly: the vector step after an episode end only
   resets that env (its action is ignored, its reward is 0), so `step_and_store` never
   stores that row. Such steps still count as environment steps.
6. `updates_per_step` gradient steps per environment step (num_envs * updates_per_step per
   vector step), each followed by the soft target update.
7. Evaluation is deterministic (u = mu(x), no noise) on a separate env seeded
   seed + 10_000 + i for episode i.
8. Checkpoints (plain dict, `torch.load(weights_only=True)`): networks, optimizer, the
   filled part of the replay buffer, counters, the OU state and the state of the two
   generators the file draws from: torch's (initialisation) and numpy's `rng` (replay
   sampling, exploration noise, random actions). Resume resets the envs (seeded with
   seed + global_step), so the episode in progress at save time is dropped. SIGINT/SIGTERM
   skip any evaluation still due, save a checkpoint and exit 0 without summary.json
   (summary.json means "finished"); a second SIGINT or SIGTERM kills at once. Resume and --eval-only
   write into --run-dir, else the folder above the checkpoint's checkpoints/ folder.

Deviations from the paper and public ports, set for Pendulum-v1 in 20k steps (c and d also
checked on InvertedPendulum-v5 in 30k; e measured there and on HalfCheetah-v5 in 100k; f, an
option, on HalfCheetah-v5; g on those three tasks and Hopper-v5; a-f were measured without g,
but for the last sentences of a and d, which name the preset they ran on; h, i and j, options,
came last, on HalfCheetah-v5 and Hopper-v5 with g and the presets' Gaussian noise 0.1, before
`naf-halfcheetah` took 0.05):
a. tau = 0.005 (public ports 1e-3): with 1e-3 the target would trail the network by ~1000
   updates, slow for propagating Pendulum's values within a 20k-step budget. TD3 moves its targets
   only every second update, about tau 0.0025 a step; with the zoo's `naf-halfcheetah` that pace
   was slower (seed 3: 1,927 at 50k and 3,628 at 100k against 2,693 and 4,383). Twice the pace,
   tau 0.01, climbed sooner there (IQM of seeds 1-5 at 20k: 938 against 222) but ended lower, on 6
   of 7 seeds: 5,039, 4,905, 3,630, 3,309, 5,854, 4,204, 3,327 (IQM of seeds 1-5: 4,524 against
   5,148), behind at every 10k evaluation from 40k on.
b. hidden_dim = 256 without batch normalisation (ports: 128-200, some with batch norm):
   per-sample ReLU layers keep acting and evaluation independent of the batch.
c. Exploration noise that decays: OU sigma 0.3 (DDPG: 0.2) falling linearly to 0.05 over the
   first 15,000 steps (the pytorch-ddpg-naf port decays its OU scale over its first episodes).
   Each end was measured (issue 13; curves and commands in results/issue13-ablations):
   - Early, much noise. With Gaussian 0.1 from the start, 2 of 4 Pendulum seeds collapsed
     (-1558, -1547; Gaussian 0.2 did so on 1 of 3): P -> 0 (exp of a very negative diagonal),
     so A stopped depending on u, mu saturated at +-1 and got no gradient.
   - Later, little noise. OU's stationary std is sigma / sqrt(theta (2 - theta)) = 1.9 sigma,
     so a constant OU 0.3 shifts actions by 0.57 of the half-range. On InvertedPendulum-v5 the
     training episodes then end after ~15 steps, the replay holds almost only falls, and Q
     diverges: the batch mean of Q(x, u) was 333-409 after 30k steps on all 5 seeds, where no
     return exceeds 1 / (1 - gamma) = 100. With the decay (5 seeds), training episodes run for
     hundreds of steps and Q ends at 145-160: still optimistic, but a fifth of the excess. The
     evaluations were about as steady either way: the last three (20k, 25k, 30k steps) were all
     >= 950 on 5 of 5 seeds with the decay and 4 of 5 without, and single evaluations below
     950 after first reaching it were 3 of 46 against 2 of 34 (one every 2,500 steps).
     Pendulum-v1 at 20k steps: -122 to -148, mean -137, the same as with the constant OU 0.3
     (-123 to -147, mean -137).
d. Gradient-norm clipping at 10 (not in the paper; `--max-grad-norm`), a safeguard: early TD
   errors on Pendulum are large (returns near -1600) and exp on the diagonal of L amplifies big
   steps. The port's clip at 1 with its heads initialised at 0.1 scale (`--max-grad-norm 1
   --head-init-scale 0.1`) did not stop the divergence under constant OU noise on
   InvertedPendulum-v5 (Q 454 at 30k steps, an evaluation at 52 at 27.5k; 1 seed). On
   HalfCheetah-v5 with the zoo's preset the clip is more than a safeguard: at 100k steps the loss's
   gradient norm (median over 50 replayed batches of 256) was 141-289 on 3 seeds, so it rescaled
   every step, and it helps there: without it (`--max-grad-norm 0`, 5 seeds) the runs ended at 4,554,
   3,900, 3,496, 5,538 and 4,870 against 4,590, 4,954, 5,175, 3,247 and 5,052 (IQM 4,442 against
   4,865), behind at every 10k evaluation from 20k on, and seed 4 dropped to 1,674 at 80k.
   Several updates per step ran only in HalfCheetah screens (below: 5 still ran upside down, 2 with
   TD3's start ended at 2,087 and 1,493 against 2,354 and 2,241 on 2 seeds; 2 per step with the
   preset, seed 2, was at 3,231 against 4,073 when stopped at 60k). With the preset since i and
   noise 0.05, where LayerNorm might let more updates per step work, as in RLPD, 2 per step climbed
   sooner (seeds 3 and 5 at 20k: 1,548 and 1,915 against 66 and 226) but did not keep it: seed 3
   ended at 4,432 against 4,383, seed 5 fell to 870 at 100k after 4,250 (preset: 4,266), and seed
   1 was at 2,948 against 3,958 at 60k when stopped; a run took 1.6-1.8 times as long. Input
   normalisation is e.
e. Input normalisation, off by default (`--normalize-obs`; on in the zoo's `naf-halfcheetah`):
   the network reads clip((x - mean) / sqrt(var + 1e-8), -10, 10), with mean and var running over
   every observation a training step returned (SB3 VecNormalize's constants). x and x' of a
   batch go through the same, current statistics, and the checkpoint carries them. Measured
   (issue 13, 5 seeds per task, beside the defaults):
   - HalfCheetah-v5, 100k steps: final IQM 1,174 alone and 1,374 with 400 hidden units (seeds
     1,202-1,408), against 1,046 (885-1,620); each IQM ahead at every 10k evaluation.
   - InvertedPendulum-v5, 30k steps: the evaluations at 20k, 25k and 30k all >= 950 on only 2 of
     5 seeds (two ended at 49 and 85), against 5 of 5 without. A likely reason, not measured: as
     the policy learns to balance, the observations narrow, so the statistics keep moving under
     the network.
   - Pendulum-v1, 20k steps: a tie (IQM -138.7 against -138.6).
f. A curvature floor, off by default (`--curvature-floor`): P = L L^T + floor I. With exp on L's
   diagonal, P_11 = exp(2 l_11) is the one entry of P made of a single term, and its gradient
   carries that same factor, so once l_11 is far below 0 the way back is slow (a likely reason; no
   l_11 trajectory was recorded). A then no longer depends on u_1, and mu_1 gets no gradient of its
   own; it moves only with the shared trunk. This is what HalfCheetah-v5 showed, more with training
   time (results/issue13-ablations/naf_heads.py, on the replay's last 5k states): the median P_11
   was 0.03-1.3 at 15k steps (12 screens), 0.001-0.021 at 50k (4 screens), and <= 0.005 at 100k in
   11 of 12 runs with TD3's start and 1 of 3 without, where the other P_jj were 0.2-5.2 (runs that
   did not diverge). P_11 alone does not decide the return: the run that kept it (0.14) was the
   preset's best seed (4,018), but one that lost it ended at 4,022. A floor of 0.01 (the only value
   tried) keeps every direction curved, but showed no gain (5 seeds, below): final mean 3,051
   against 3,074 (IQM 3,355 against 3,036, inside the seeds' spread), and an IQM behind at every 10k
   evaluation from 30k to 90k (1,484 against 1,887 at 50k). mu_1 stayed saturated (|mu_1| > 0.99,
   where tanh' < 0.02, on 85% of seed 1's states). With g and the HalfCheetah preset's twins (h),
   seeds 1 and 2 ended at 5,072 and 3,791 against 4,607 and 4,330 without the floor: two seeds, no
   clearer. The flag is there to ablate the parameterisation; it is not a setting that won.
g. A penalty on mu before tanh, weight 0.01 (`--pre-tanh-penalty`, 0 for the paper's loss; rlkit's
   SAC trainers have it as `policy_pre_activation_weight`, summed over components there): the loss
   adds penalty * the mean over batch and components of (mu before tanh)^2. The TD loss reaches mu
   only through tanh, whose slope is below 0.01 past |3|, so a component driven into the tail gets
   almost no gradient back; the penalty's gradient, 2 penalty (mu before tanh) / (B |A|), grows the
   further in it is. Measured (issue 13, 5 seeds per row unless it says so; 0.01 is the one weight
   run in full, and single-seed pointers at 0.001 and 0.03 on Hopper-v5 did no better):
   - Hopper-v5, 100k steps, the zoo's locomotion flags: without the penalty the thigh's mu sat at its
     bound on 95-100% of the greedy policy's steps on every seed (median |mu before tanh| 15-90; RL
     Zoo's TD3 actor: 0-20%), and each seed stood still (a return near 1,000 is 1 per step for
     staying up) or fell. With it: 0-17% (medians 0.0-1.0); three seeds hop forward at 0.9-1.9 m/s,
     and the final IQM is 798 against 333 (TD3: 875). One seed fell at the end (118 after 1,032).
   - HalfCheetah-v5, 100k steps: final IQM 3,796 against 3,036 with the zoo's flags, ahead at
     every 10k evaluation from 20k on. With the defaults otherwise 1,254 against 1,046, ahead from
     20k on, but 4 of 5 seeds still ran on their backs, and one ended below half its best (590
     after 1,283), where all 5 had held without the penalty (below).
   - Pendulum-v1 (20k) and InvertedPendulum-v5 (30k), the defaults otherwise: a tie. Pendulum's final
     mean was -134 against -137; on InvertedPendulum the evaluations at 20k, 25k and 30k were all
     >= 950 on 5 of 5 seeds either way, and 3 evaluations fell below 950 after first reaching it
     either way (every 2,500 steps).
   - HalfCheetah-v5 with the zoo's `naf-halfcheetah`: the penalty keeps mu off the bounds, where RL
     Zoo's TD3 actor spends 40-93% of its steps per component (|u| > 0.99; 4 seeds; NAF 0-10%, at a
     median |mu before tanh| of 0.3-1.9). Freeing mu did not help. At 0 it saturated again (seed 1:
     |mu before tanh| 17-18, 1,046 at 70k when stopped). 0.001 was behind on both seeds run (seed 1
     ended at 3,267; seed 2 at 60k: 2,887 against 4,336; stopped at 65k) and 0.03 ended lower on
     seeds 1-3 (4,605, 3,864, 3,618; the preset 5,902, 5,624, 4,383). A penalty on only the part of
     |mu before tanh| past 2 (a screening copy, 5 seeds) put components at a bound on up to 82% of
     steps but ended at 5,486, 3,718, 4,463, 3,772 and 5,980 (IQM 4,574 against 5,148). So the
     bounds are not what keeps NAF below TD3 there.
   It does not revive P_11 (deviation f: median 0.000-0.021 at 100k on HalfCheetah with it).
h. Twin networks, off by default (`--twin-q`; on in the zoo's `naf-halfcheetah`, with TD3's batch of
   256): two NAF networks, initialised apart, each fitted to the same target
   y = r + gamma (1 - terminated) min(V_1'(x'), V_2'(x')), and the loss is the sum of their two
   losses. This is TD3's clipped double Q (Fujimoto et al. 2018): V' is the target network's own
   maximum over u, and a maximum of noisy estimates is biased upwards, so the errors it passes into y
   lean up; the smaller of two networks fitted apart leans less. The first network acts and is
   evaluated; the gradient norm is clipped over both. Each update costs two networks' forward and
   backward passes. Measured (issue 13, 100k steps, the zoo's locomotion flags with g, 5 seeds unless
   a row says so):
   - HalfCheetah-v5 with batch 256: final evaluations 4,607, 4,330, 3,867, 4,224, 4,345 (IQM 4,300)
     against 4,071, 2,365, 4,333, 2,983, 4,504 (IQM 3,796) with one network at batch 128; the
     worst seed 3,867 against 2,365, and every seed ended at >= 96% of its best. Steadier more
     than faster: the IQM curve was behind at 20k, 30k and 50k-70k, ahead at 40k and 80k-100k.
     Batch 256 with one network had diverged on 2 of 3 seeds before g (below); with g it did not
     on those two seeds (batch mean of Q(x, u) at most 177 and 283) but ended at 1,991 and 3,688
     (twins: 4,330 and 3,867). Twins cost twice the wall time here (17.8-22.0 min a run against
     9.3-10.8, two runs at a time).
   - Batch 128 (the default): HalfCheetah-v5 seed 1 ended at 3,993 against 4,071 without it; on
     Hopper-v5 4 seeds ended at 394, 219, 1,017 and 88 (IQM 307) against 686, 1,831, 118 and 721 on
     the same seeds. Twins at batch 256 on Hopper-v5 seeds 2 and 3: 110 and 500 (one network:
     1,831 and 118). So the zoo's `naf-hopper` keeps batch 128 and one network.
i. A LayerNorm after each hidden linear layer, before its ReLU, off by default (`--layer-norm`; on
   in the zoo's `naf-halfcheetah`): each layer's pre-activations are standardised per sample over
   the layer's units, then scaled and shifted by learned gains (Ba et al. 2016), so acting and
   evaluation stay independent of the batch (b's reason against batch norm). RLPD (Ball et al. 2023) puts it in its critics to keep
   values from extrapolating far past the data; why it helps NAF here was not measured. Measured
   (issue 13, 100k steps, the zoo's locomotion flags with g):
   - HalfCheetah-v5 with the preset's twins at batch 256 (h; 5 seeds): 4,590, 4,954, 5,175, 3,247
     and 5,052 (IQM 4,865) against 4,607, 4,330, 3,867, 4,224 and 4,345 (IQM 4,300); every seed
     ended at >= 72% of its best (seed 4: 3,247 after 4,482). Ahead on 3 seeds, level on one,
     behind on one; the IQM curve was ahead at every 10k evaluation from 20k on (3,567 at 50k
     against 2,843; TD3 3,554). A run took 1,262-1,522 s against 1,069-1,320 s (two at a time).
   - HalfCheetah-v5 with one network at batch 128 (5 seeds): 3,535, 3,166, 4,929, 4,101 and 2,548
     (IQM 3,601) against 4,071, 2,365, 4,333, 2,983 and 4,504 (IQM 3,796); seed 5 reached 6,039 at
     90k, then fell to 2,548.
   - Hopper-v5 with `naf-hopper`'s flags (one network, seeds 1 and 3): 1,022 and 398 against 686
     and 118; seed 3 ended below half its best (1,115).
j. TD3's target policy smoothing, off by default (`--target-noise sigma`): TD3 bootstraps from
   Q'(x', mu'(x') + eps), eps ~ N(0, sigma^2 I), so that a narrow peak of Q' around mu' does not pass
   into y. NAF's Q' is quadratic in u, so the mean over eps has a closed form,
   E Q'(x', mu'(x') + eps) = V'(x') - sigma^2/2 tr P'(x'), and y takes that mean with no sampling
   noise (TD3's clips of eps to +-0.5 and of the action to its bounds are left out). With h, each
   twin's smoothed V' enters the minimum. Measured (issue 13, HalfCheetah-v5, 100k steps, the zoo's
   `naf-halfcheetah` with sigma 0.2, TD3's value; 5 seeds): 4,037, 5,036, 3,841, 4,875 and 3,837
   against 4,590, 4,954, 5,175, 3,247 and 5,052 without it, IQM 4,251 against 4,865 and behind at
   every 10k evaluation. The term is not small: at 100k the median tr P' over 4,096 replayed states
   was 17 on seeds 1 and 4 (10.9 on seed 4 without j), so sigma 0.2 took about 0.34 off V' at each
   bootstrap. That compounds like a reward 0.34 lower every step, against the 2.7 a step that a V'
   of about 270 stands for at gamma 0.99. On Hopper-v5 (`naf-hopper`, seed 3) it ended at
   363 after 1,048, below half its best as without it (118 after 1,032). The flag is there to
   ablate TD3's third component; it is not a setting that won.
Measured on locomotion (issue 13; results/issue13-ablations, whose gait.py replays a checkpoint),
before g unless a row says so: on HalfCheetah-v5 with the defaults NAF learns to run on its back. At
15k steps the greedy policy of each of 4 seeds turned the cheetah over within the first 15-165 steps
of every replayed episode, and already moved it forward upside down (0.2-1.2 m/s); a rerun to 100k
still did (1.3 m/s). That gait levels off near a return of 1,400, the plateau of every setting above
measured before g. Upside down too: normalisation (3 of 4 seeds at 15k; with 400 units, 2 of 2 at
100k), 5 updates per step (2 of 2 at 12k), OU 0.1 (1 of 2), Gaussian 0.1 (2 of 2), --head-init-scale
0.1 and --tau 0.001 (4 of 4 each). TD3's start, 10k uniform random steps and then Gaussian noise 0.1
(the zoo's `naf-halfcheetah` until it took 0.05), changes the order: at 15k the policy is upside
down but not moving, as d4pg.py's is at 10k, and it learns to run upright afterwards (13 of 15
replayed episodes at 100k upright throughout, mean speed 2.3-4.7 m/s by seed; d4pg: upright from
30k). Final evaluations, same task and budget (5 seeds):
  naf.py (defaults, with g):                                1,528, 1,096, 1,138, 590, 2,562 (IQM 1,254; seed 5 upright)
  naf.py without g (the defaults before it):                885, 1,007, 948, 1,183, 1,620 (IQM 1,046)
  without g, --hidden-dim 400 --normalize-obs:              1,202, 1,408, 1,372, 1,391, 1,357 (IQM 1,374)
  the zoo's preset (TD3's start with Gaussian noise 0.05,
    --normalize-obs --twin-q --batch-size 256 --layer-norm;
    deviations h and i):                                    5,902, 5,624, 4,383, 5,438, 4,266 (IQM 5,148)
    the same with noise 0.02 (3 seeds):                     5,312, 2,942, 3,286
  the preset with TD3's noise 0.1 (the preset before):      4,590, 4,954, 5,175, 3,247, 5,052 (IQM 4,865)
    the same without --layer-norm:                          4,607, 4,330, 3,867, 4,224, 4,345 (IQM 4,300)
  --normalize-obs, TD3's start (the preset before h):       4,071, 2,365, 4,333, 2,983, 4,504 (IQM 3,796)
    the same without g:                                     2,354, 2,241, 4,018, 3,344, 3,411 (IQM 3,036)
    without g, --curvature-floor 0.01 (deviation f):        3,480, 3,368, 3,217, 1,570, 3,621 (IQM 3,355)
    without g, --batch-size 256 (TD3's batch; 3 seeds):     4,022, -494, -596 (two diverged)
  d4pg.py:                                                  6,994, 6,714, 6,649, 6,226, 5,639 (`--sigma 0.1 --n-step 1`, IQM 6,530)
  RL Zoo's TD3:                                             5,787, 5,940, 4,753, 3,804, 5,886 (IQM 5,476)
Upright, NAF climbed more slowly than TD3 until i (IQM at 50k: 1,887 without g, 2,981 with it, 2,843
with h, 3,567 with i, TD3 3,554). With i the IQM was at or above TD3's at every 10k evaluation from
20k to 90k but 80k (4,241 against 4,336), and 89% of it at 100k (4,865 against 5,476). With noise
0.05 instead of 0.1 every seed ended at >= 96% of its best and the IQM at 100k rose to 94% of
TD3's (5,148), but it was lower from 40k to 70k (3,781 at 70k against 4,151; TD3 3,900). Why less
noise helps is open; replayed actions did not lie nearer mu: over the last 5,000 transitions
the median |u - mu(x)| at 100k was 0.31-0.54 with 0.05 and 0.34-0.57 with 0.1 (the policy's
drift). Less still, 0.02, went too far (seeds 1-3: 5,312, 2,942, 3,286). Noise falling linearly
from 0.1 to 0.05 over the run, for 0.1's middle and 0.05's end, ended behind (seeds 1, 2, 3, 5:
4,802, 3,396, 4,142, 4,713 against 5,902, 5,624, 4,383, 4,266). Four more seeds on each side
widened the gap: NAF ended at 5,074, 4,260, 3,400 and 3,440 (seeds 6-9), TD3 at 4,772, 5,333,
5,649 and 5,326. Over seeds 1-7 the IQM was 4,957 against 5,306 (93%; a bootstrap's 95% interval
of the difference: -1,104 to +629); over seeds 1-9 it was 4,684 against 5,373 (87%; interval -1,584
to +230, NAF ahead in 7% of resamples), so at this budget NAF looked more likely behind TD3 than level.
Five more on each side settle it: NAF ended at 5,103, 5,326, 3,151, 1,809 and 4,348 (seeds 10-14;
seed 13 on its back in six of ten evaluation episodes), TD3 at 4,942, 5,219, 4,355, 6,407 and 5,044.
Over seeds 1-14 the IQM is 4,525 against 5,259 (86%; Welch's t-test p = 0.029; bootstrap interval
-1,529 to -16): TD3's IQM curve reached NAF's final at 80k, about 20k steps sooner.
On Hopper-v5, noise 0.05 did worse (seeds 1-3: 314, 996, 294 against 686, 1,831, 118). Separate
networks do not close the gap: with V, mu and L each read from its own MLP, as railrl's QuadraticNAF
does (a screening copy, one network, seeds 1-4), NAF climbed more slowly still (IQM at 50k 1,597;
the shared trunk on those seeds 3,120) and ended at 3,150, 4,634, 2,228 and 3,064 (shared trunk:
4,071, 2,365, 4,333, 2,983), at 1.7 times the CPU time per update; on Hopper-v5 at 970, 217, 262 and
789 (shared trunk: 686, 1,831, 118, 988). Nor, on HalfCheetah, does Gaussian noise 0.2 (seeds 1 and
3: 3,954 and 3,328 against 4,071 and 4,333), nor, on the preset, TD3's target smoothing (j: IQM
4,251), dropping the gradient clip (d: IQM 4,442), letting mu reach the bounds that TD3's actor
acts at (g: IQM 4,574 with the penalty only past |mu before tanh| 2), or the TD3 authors' learning
rate, 3e-4 (seeds 1 and 2: 2,851 and 3,399, behind from 30k on). Screened on one or two seeds each,
none of these ended above the preset on any seed: raw inputs with LayerNorm (5,435 and 3,536 against
5,902 and 5,624), a learning rate of 2e-3 (seed 1: 3,930), batch 512 (seeds 3 and 5: 4,174 and 2,505
against 4,383 and 4,266), adaptive parameter-space noise (Plappert et al. 2018; seeds 3 and 5: 3,326
and 3,622), and TD3's clipped double Q, both networks judged at the acting one's mu (seed 1's
critic diverged downward from 29k; mu saturated and it stood still, at -574 to -595 from 40k until
stopped at 60k). Nor did levers that were ahead of the preset on one seed or for a stretch: a
tenth of the Q scale (rewards x 0.1 in the target, penalty and clip norm x 0.01 to keep their
weight; a screening copy; seeds 3 and 5: 3,192 and 4,391 against 4,383 and 4,266), learning from 5k
steps rather than 10k (seeds 1, 2, 3 and 5: 2,915, 3,841, 4,718 and 3,983, IQM 3,912 against 5,004;
seed 1's final policy flipped onto its back in 3 of 10 evaluation episodes), and from 20k (seeds 3
and 5: ahead from 50k or 60k to 90k, then 2,654 and 3,812; seed 3 on its back in 9 of 10 episodes).
The upside-down plateau is not a collapse or an overestimate: the 400-unit row's seeds end at >= 98%
of their best, and its batch mean of Q(x, u) over the last 10k steps (117-136) is within 6% of the
training episodes' mean reward per step held forever (return / 1000 / (1 - gamma): 111-133). The two
runs with batch 256 that failed did diverge: at 100k steps the median V(x) was 13,600 and 40,800
(the preset's seeds without g: 260-400), the batch mean of Q(x, u) had taken off from about 50k and
35k steps, and mu was saturated on 98-100% of states: by all appearances the target's maximum,
V'(x'), fed on itself. TD3's start is not the default: its 10k random steps are half of
Pendulum-v1's budget, and Gaussian noise 0.1 from the start collapsed Pendulum seeds (deviation c).
Why the longer random start changes the order was not measured: Gaussian 0.1 after the default 1k
random steps still ran upside down. On Hopper-v5 (100k steps, 5 seeds) the preset's flags ended at
1,009, 126, 214, 661 and 110 without g (IQM 333), and at 686, 1,831, 118, 988 and 721 with it (the
zoo's `naf-hopper`, IQM 798), against RL Zoo's TD3 at 2,355, 422, 605, 1,328 and 690 (IQM 875).
Gaussian noise 0.2 instead of 0.1 there (5 seeds): IQM 635, and 3 seeds ended below half their best.
Walker2d-v5 at 100k steps is too short to compare on: RL Zoo's TD3 ended at 237 and 462 (seeds 1 and
2; its untrained actor scored 314), and NAF's seed 1 at 73 (best 428) with `naf-hopper`'s flags and
207 (best 318) with `naf-halfcheetah`'s. So is Ant-v5: standing still for its 1,000 steps scores
about 1,000, as TD3's untrained actor did at 5k and 10k (988, 990), and once updates began neither
method got back to it before the runs were stopped (seed 1 each: TD3 12-389 to 45k; NAF with
`naf-halfcheetah`'s flags 271-720 to 60k). So is Humanoid-v5 (seed 1 each): TD3's untrained actor
scored 161-167, then 53 from 15k to 70k (episodes of 14 steps), and NAF 248-275 untrained, then
278-475 to 85k: neither stays up for 100 steps. Swimmer-v5 (`naf-hopper`'s flags, seed 1) settled at
44, the plateau of off-policy methods there at gamma 0.99, and with RL Zoo's gamma 0.9999 fell back
to 7 after 39. For locomotion, prefer d4pg.py.

Usage: python algos/naf.py --env-id Pendulum-v1 --total-steps 20000 --seed 1
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle OpenMP threads sleep instead of spinning

import copy
import importlib.util
import json
import random
import resource
import signal
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter

OU_THETA = 0.15  # Ornstein-Uhlenbeck mean reversion (paper / DDPG, Lillicrap et al. 2015)
NET_KEYS = ("", "twin_")  # checkpoint key prefixes of the acting network and its twin (deviation h)


@dataclass
class Args:
    env_id: str = "Pendulum-v1"
    """Gymnasium id of an environment with Box actions and flat Box observations"""
    seed: int = 1
    """seed of python, numpy, torch and the environments"""
    total_steps: int = 20_000
    """environment steps to train for (summed over envs)"""
    num_envs: int = 1
    """parallel environments in one synchronous vector env"""
    torch_deterministic: bool = True
    """torch.use_deterministic_algorithms, for identical runs on CPU"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto picks cuda when available"""
    exp_name: str = "naf"
    """experiment name, part of the default run directory"""
    run_dir: str | None = None
    """output directory (default runs/<env>__<exp>__<seed>__<unixtime>)"""
    checkpoint_interval: int = 10_000
    """save a checkpoint every this many env steps (0: only at the end)"""
    resume: str | None = None
    """checkpoint to continue from (its run directory is reused)"""
    eval_episodes: int = 10
    """deterministic evaluation episodes (periodic and final)"""
    eval_interval: int = 5_000
    """evaluate every this many env steps (0: only at the end)"""
    eval_only: bool = False
    """only evaluate --checkpoint (its env, network and seed), write eval.json and exit"""
    checkpoint: str | None = None
    """checkpoint to evaluate with --eval-only"""
    capture_video: bool = False
    """record the final (or --eval-only) evaluation episodes as mp4 in <run_dir>/videos"""
    track: bool = False
    """log to Weights & Biases (mode from WANDB_MODE)"""
    wandb_project_name: str = "rl-training"
    """Weights & Biases project"""
    # Algorithm-specific
    buffer_size: int = 1_000_000
    """replay buffer capacity (transitions)"""
    batch_size: int = 128
    """minibatch size of each gradient step"""
    learning_rate: float = 1e-3
    """Adam learning rate"""
    tau: float = 0.005
    """soft target update rate, theta' <- tau theta + (1 - tau) theta'"""
    gamma: float = 0.99
    """discount factor"""
    hidden_dim: int = 256
    """units in each of the two hidden layers"""
    learning_starts: int = 1_000
    """env steps of uniform random actions before learning starts"""
    noise: Literal["gaussian", "ou"] = "ou"
    """exploration noise process, added to mu(x) in [-1, 1] action space"""
    noise_scale: float = 0.3
    """sigma of the OU process / std of the Gaussian noise at the start (detail 3)"""
    updates_per_step: int = 1
    """gradient steps per environment step"""
    final_noise_scale: float | None = 0.05
    """noise scale reached linearly at --noise-decay-steps, then kept (None: constant --noise-scale)"""
    noise_decay_steps: int = 15_000
    """environment steps over which the noise scale falls to --final-noise-scale (0: constant)"""
    head_init_scale: float = 1.0
    """factor on the initial weights and biases of the V, mu and L heads"""
    max_grad_norm: float = 10.0
    """clip the gradient to this global norm (0: off)"""
    curvature_floor: float = 0.0
    """added to P's eigenvalues, P = L L^T + curvature_floor I, so A is concave along every action direction (deviation f)"""
    pre_tanh_penalty: float = 0.01
    """weight of mean((mu before tanh)^2) added to the loss, keeping mu off tanh's flat tails (deviation g; 0: the paper)"""
    twin_q: bool = False
    """learn two networks and bootstrap from the smaller V'(x'), as TD3's clipped double Q (deviation h); the first one acts"""
    normalize_obs: bool = False
    """feed the network observations standardised by the running mean and variance of all seen so far (deviation e)"""
    layer_norm: bool = False
    """a LayerNorm after each hidden linear layer, before its ReLU (deviation i)"""
    target_noise: float = 0.0
    """sigma of TD3's target smoothing, taken in closed form: y bootstraps from V'(x') - sigma^2/2 tr P'(x') (deviation j; 0: off)"""


# ---------------------------------------------------------------- environment
def make_env(env_id: str, render_mode: str | None = None) -> gym.Env:
    """gym.make with unknown ids and unsupported spaces turned into one-line errors."""
    if env_id not in gym.registry:
        try:  # Atari ids register only once ale_py is imported
            import ale_py

            gym.register_envs(ale_py)
        except ImportError:
            pass
    try:
        env = gym.make(env_id, **({"render_mode": render_mode} if render_mode else {}))
    except Exception as e:  # unknown id, missing entry-point module, missing dependency
        raise fail(f"cannot make environment {env_id!r} ({str(e).splitlines()[0]}); check the id with gymnasium.pprint_registry()")
    obs_space, act_space, problem = env.observation_space, env.action_space, None
    if isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) > 1:
        problem = f"has image observations {obs_space.shape}; use ppo_atari.py or dqn_atari.py"
    elif isinstance(act_space, gym.spaces.Discrete):
        problem = "has a discrete action space; NAF needs Box actions, use ppg.py"
    elif not isinstance(act_space, gym.spaces.Box) or not isinstance(obs_space, gym.spaces.Box):
        problem = f"has {type(obs_space).__name__} observations and {type(act_space).__name__} actions; naf.py needs flat Box ones"
    elif not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
        problem = "has unbounded actions; naf.py needs finite action bounds to scale [-1, 1] onto"
    if problem:
        env.close()
        raise fail(f"{env_id} {problem}")
    return env


def make_vector_env(env_id: str, num_envs: int, seed: int) -> tuple[gym.vector.VectorEnv, np.ndarray]:
    make_env(env_id).close()  # validate once, in the main process, before building the copies
    # NEXT_STEP autoreset on purpose (detail 5): step_and_store drops the reset step.
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    obs, _ = envs.reset(seed=seed)
    return envs, obs


def scale_action(u: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The one place that maps the network's u in [-1, 1] to the env's [low, high] (detail 2)."""
    return low + 0.5 * (u + 1.0) * (high - low)


# ---------------------------------------------------------------- network
class NAFNetwork(nn.Module):
    """Trunk with heads V(x), mu(x) and the entries of L(x) (detail 1)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_dim: int, head_init_scale: float = 1.0, normalize_obs: bool = False, layer_norm: bool = False):
        super().__init__()
        self.act_dim, self.normalize_obs = act_dim, normalize_obs
        def layer(n_in: int) -> list[nn.Module]:  # Linear, [LayerNorm (deviation i)], ReLU: without it the keys stay trunk.0 and trunk.2
            return [nn.Linear(n_in, hidden_dim), *([nn.LayerNorm(hidden_dim)] if layer_norm else []), nn.ReLU()]
        self.trunk = nn.Sequential(*layer(obs_dim), *layer(hidden_dim))
        self.v_head = nn.Linear(hidden_dim, 1)
        self.mu_head = nn.Linear(hidden_dim, act_dim)
        self.l_head = nn.Linear(hidden_dim, act_dim * (act_dim + 1) // 2)
        for p in (*self.v_head.parameters(), *self.mu_head.parameters(), *self.l_head.parameters()):
            p.data.mul_(head_init_scale)
        self.register_buffer("tril", torch.tril_indices(act_dim, act_dim), persistent=False)
        # Deviation e: count, sum x and sum x^2 of every observation a step returned (in the checkpoint
        # only with the flag, so checkpoints without it keep their format).
        self.register_buffer("obs_moments", torch.zeros(3, obs_dim, dtype=torch.float64), persistent=normalize_obs)

    def observe(self, obs: np.ndarray) -> None:  # float64 sums keep var = E[x^2] - E[x]^2 accurate over long runs
        x = torch.as_tensor(obs, dtype=torch.float64, device=self.obs_moments.device)
        self.obs_moments += torch.stack([torch.full_like(x[0], len(x)), x.sum(0), x.square().sum(0)])

    def features(self, x: torch.Tensor) -> torch.Tensor:  # the trunk's output, shared by the three heads
        if self.normalize_obs:  # deviation e: clip((x - mean) / sqrt(var + 1e-8), -10, 10)
            mean, mean_sq = self.obs_moments[1:] / self.obs_moments[0].clamp(min=1.0)  # no NaN before the first step
            x = ((x - mean) / ((mean_sq - mean.square()).clamp(min=0.0) + 1e-8).sqrt()).clamp(-10.0, 10.0).float()
        return self.trunk(x)

    def value(self, x: torch.Tensor, sigma: float = 0.0, floor: float = 0.0) -> torch.Tensor:
        """V(x) for the target; with sigma > 0 its mean under TD3's smoothing (deviation j): E Q(x, mu + eps) = V - sigma^2/2 tr P, eps ~ N(0, sigma^2 I)."""
        if sigma == 0.0:  # V alone: the mu and L heads are not needed
            return self.v_head(self.features(x)).squeeze(-1)
        V, _, L, _ = self(x)
        return V - 0.5 * sigma**2 * (L.square().sum((1, 2)) + floor * self.act_dim)  # tr(L L^T + floor I) = |L|_F^2 + floor |A|

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns V(x) [B], mu(x) [B, |A|] in [-1, 1], L(x) [B, |A|, |A|] and mu before tanh [B, |A|]."""
        h = self.features(x)
        L = h.new_zeros(x.shape[0], self.act_dim, self.act_dim)
        L[:, self.tril[0], self.tril[1]] = self.l_head(h)
        # exp on the diagonal makes P = L L^T positive definite (paper, Section 4).
        L = torch.tril(L, diagonal=-1) + torch.diag_embed(torch.diagonal(L, dim1=1, dim2=2).exp())
        pre_tanh = self.mu_head(h)
        return self.v_head(h).squeeze(-1), torch.tanh(pre_tanh), L, pre_tanh


# ---------------------------------------------------------------- NAF math
def advantage(u: torch.Tensor, mu: torch.Tensor, L: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """A(x, u) = -1/2 (u - mu)^T P (u - mu) with P = L L^T + floor I (floor 0: the paper; deviation f)."""
    P = L @ L.transpose(1, 2) + floor * torch.eye(L.shape[-1], device=L.device)
    d = (u - mu).unsqueeze(-1)
    return -0.5 * (d.transpose(1, 2) @ P @ d).squeeze(-1).squeeze(-1)


def q_value(V: torch.Tensor, mu: torch.Tensor, L: torch.Tensor, u: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """Q(x, u) = V(x) + A(x, u)."""
    return V + advantage(u, mu, L, floor)


def td_target(r: torch.Tensor, terminated: torch.Tensor, V_next: torch.Tensor, gamma: float) -> torch.Tensor:
    """y = r + gamma (1 - terminated) V'(x'); truncation is not an input, so it bootstraps (detail 4)."""
    return r + gamma * (1.0 - terminated) * V_next


def naf_loss(nets: Sequence[NAFNetwork], target_nets: Sequence[NAFNetwork], batch: dict[str, torch.Tensor], gamma: float, floor: float = 0.0, penalty: float = 0.0, sigma: float = 0.0):
    """Returns (loss, TD, Q(x, u)), TD and Q of the first network: TD = mean (y - Q(x, u))^2, loss = the sum over the
    networks of TD + penalty * mean((mu before tanh)^2) (deviation g); y bootstraps from the smallest V'(x') (deviation h), smoothed by sigma (deviation j)."""
    with torch.no_grad():
        V_next = torch.stack([target_net.value(batch["next_obs"], sigma, floor) for target_net in target_nets]).amin(0)
        y = td_target(batch["rewards"], batch["terminated"], V_next, gamma)
    outputs = [net(batch["obs"]) for net in nets]  # (V, mu, L, mu before tanh) of each network
    qs = [q_value(V, mu, L, batch["actions"], floor) for V, mu, L, _ in outputs]
    tds = [F.mse_loss(q, y) for q in qs]
    return sum(td + penalty * pre_tanh.square().mean() for td, (*_, pre_tanh) in zip(tds, outputs)), tds[0].detach(), qs[0].detach()


@torch.no_grad()
def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)  # one call for all tensors


def exploration_noise(kind: str, state: np.ndarray, scale: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Returns (noise, new OU state). OU: x <- x - theta x + sigma N(0, 1) (dt = 1)."""
    eps = scale * rng.standard_normal(state.shape)
    if kind == "gaussian":
        return eps, state
    state = state - OU_THETA * state + eps
    return state, state


def noise_scale(args: Args, step: int) -> float:
    """sigma of the exploration noise at `step` (detail 3): linear from noise_scale to final_noise_scale."""
    if args.final_noise_scale is None or args.noise_decay_steps <= 0:
        return args.noise_scale
    return args.noise_scale + (args.final_noise_scale - args.noise_scale) * min(1.0, step / args.noise_decay_steps)


class ReplayBuffer:
    """Preallocated ring buffer of (x, u, r, x', terminated); u in [-1, 1]."""

    FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated")

    def __init__(self, capacity: int, obs_dim: int, act_dim: int):
        self.capacity, self.ptr, self.size = capacity, 0, 0
        self.obs, self.next_obs, self.actions = (np.zeros((capacity, n), np.float32) for n in (obs_dim, obs_dim, act_dim))
        self.rewards, self.terminated = np.zeros(capacity, np.float32), np.zeros(capacity, np.float32)

    def add(self, obs, actions, rewards, next_obs, terminated) -> None:
        idx = (self.ptr + np.arange(len(rewards))) % self.capacity
        for name, value in zip(self.FIELDS, (obs, actions, rewards, next_obs, terminated)):
            getattr(self, name)[idx] = value
        self.ptr, self.size = int((self.ptr + len(rewards)) % self.capacity), min(self.size + len(rewards), self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator, device: torch.device) -> dict[str, torch.Tensor]:
        idx = rng.integers(0, self.size, batch_size)
        return {name: torch.as_tensor(getattr(self, name)[idx], device=device) for name in self.FIELDS}

    def state_dict(self) -> dict:
        # Copies of the filled part only: torch.save of a view would write the whole array.
        return {"ptr": self.ptr, "size": self.size, **{name: torch.from_numpy(getattr(self, name)[: self.size].copy()) for name in self.FIELDS}}

    def load_state_dict(self, state: dict) -> None:
        self.ptr, self.size = int(state["ptr"]), int(state["size"])
        for name in self.FIELDS:
            getattr(self, name)[: self.size] = state[name].numpy()


def step_and_store(envs, rb: ReplayBuffer, obs, u, autoreset):
    """One vector step; store only real transitions (detail 5). Returns the step's outputs
    and the mask of envs whose next step is an autoreset."""
    next_obs, rewards, terminated, truncated, infos = envs.step(scale_action(u, envs.single_action_space.low, envs.single_action_space.high))
    real = ~autoreset  # a reset step's row is no transition
    rb.add(*(a[real] for a in (obs, u, rewards, next_obs, terminated)))
    return next_obs, rewards, terminated, truncated, terminated | truncated


def update(nets: nn.ModuleList, target_nets: nn.ModuleList, optimizer, batch: dict, gamma: float, tau: float, max_grad_norm: float, floor: float = 0.0, penalty: float = 0.0, sigma: float = 0.0):
    """One gradient step on the loss (its norm clipped over all networks), then the soft target update.
    Returns (loss, TD loss, Q(x, u)), detached."""
    loss, td, q = naf_loss(nets, target_nets, batch, gamma, floor, penalty, sigma)
    optimizer.zero_grad()
    loss.backward()
    if max_grad_norm > 0:
        nn.utils.clip_grad_norm_(nets.parameters(), max_grad_norm)
    optimizer.step()
    soft_update(target_nets, nets, tau)
    return loss.detach(), td, q


def checkpoint_state(nets, target_nets, optimizer, rb: ReplayBuffer, ou_state, num_updates: int, rng) -> dict:
    networks = {}  # "net" is the acting network, under the key it had before deviation h's twin
    for prefix, net, target_net in zip(NET_KEYS, nets, target_nets):
        networks |= {prefix + "net": net.state_dict(), prefix + "target_net": target_net.state_dict()}
    return {"num_updates": num_updates, **networks,
            "optimizer": optimizer.state_dict(), "replay_buffer": rb.state_dict(),
            "ou_state": torch.from_numpy(ou_state.copy()), "rng": rng_state(torch=torch.default_generator, numpy=rng)}


# ---------------------------------------------------------------- training
def train(args: Args) -> None:
    check_args(args, [
        (args.num_envs >= 1 and args.batch_size >= 1, "--num-envs and --batch-size must be at least 1"),
        (args.buffer_size >= args.batch_size, "--buffer-size must be at least --batch-size"),
        (args.learning_rate > 0, "--learning-rate must be positive"),
        (0 < args.tau <= 1, "--tau must be in (0, 1]"),
        (0 <= args.gamma <= 1, "--gamma must be in [0, 1]"),
        (args.learning_starts >= 0, "--learning-starts must be non-negative"),
        (args.noise_scale >= 0 and (args.final_noise_scale is None or args.final_noise_scale >= 0), "--noise-scale and --final-noise-scale must be non-negative"),
        (args.noise_decay_steps >= 0 and args.max_grad_norm >= 0, "--noise-decay-steps and --max-grad-norm must be non-negative"),
        (args.head_init_scale > 0 and args.curvature_floor >= 0 and args.pre_tanh_penalty >= 0 and args.target_noise >= 0, "--head-init-scale must be positive, --curvature-floor, --pre-tanh-penalty and --target-noise non-negative"),
        (args.hidden_dim >= 1 and args.updates_per_step >= 1, "--hidden-dim and --updates-per-step must be at least 1"),
    ])
    if args.eval_only:
        return eval_only(args)
    device = pick_device(args.device)
    seed_everything(args.seed, args.torch_deterministic)
    rng = np.random.default_rng(args.seed)  # replay sampling, exploration noise, random actions
    ckpt = resume_checkpoint(args, same=("hidden_dim", "num_envs", "buffer_size", "normalize_obs", "twin_q", "layer_norm")) if args.resume else None
    global_step = ckpt["global_step"] if ckpt else 0
    envs, obs = make_vector_env(args.env_id, args.num_envs, args.seed + global_step)
    obs_dim, act_dim = int(np.prod(envs.single_observation_space.shape)), envs.single_action_space.shape[0]
    nets = nn.ModuleList(NAFNetwork(obs_dim, act_dim, args.hidden_dim, args.head_init_scale, args.normalize_obs, args.layer_norm) for _ in range(1 + args.twin_q)).to(device)
    target_nets, net = copy.deepcopy(nets), nets[0]  # net acts and is evaluated
    for other in (*nets[1:], *target_nets):
        other.obs_moments = net.obs_moments  # one set of statistics for x and x' and every network (deviation e)
    optimizer = torch.optim.Adam(nets.parameters(), lr=args.learning_rate, fused=True)  # one kernel, not a loop of ops per tensor
    rb = ReplayBuffer(args.buffer_size, obs_dim, act_dim)
    ou_state, num_updates = np.zeros((args.num_envs, act_dim)), 0
    if ckpt:
        for prefix, one_net, one_target in zip(NET_KEYS, nets, target_nets):
            one_net.load_state_dict(ckpt[prefix + "net"])
            one_target.load_state_dict(ckpt[prefix + "target_net"])
        optimizer.load_state_dict(ckpt["optimizer"])
        rb.load_state_dict(ckpt["replay_buffer"])
        ou_state, num_updates = ckpt["ou_state"].numpy().copy(), ckpt["num_updates"]
        set_rng_state(ckpt["rng"], torch=torch.default_generator, numpy=rng)
    stop = StopSignal()
    with RunLogger(args, run_dir_for(args, args.resume), global_step, resumed=ckpt is not None) as log:
        autoreset = np.zeros(args.num_envs, bool)
        ep_return, ep_length = np.zeros(args.num_envs), np.zeros(args.num_envs, int)
        while global_step < args.total_steps and not stop:
            if global_step < args.learning_starts:
                u = rng.uniform(-1.0, 1.0, (args.num_envs, act_dim)).astype(np.float32)
            else:
                with torch.inference_mode():
                    _, mu, _, _ = net(torch.as_tensor(obs, dtype=torch.float32, device=device))
                noise, ou_state = exploration_noise(args.noise, ou_state, noise_scale(args, global_step), rng)
                u = np.clip(mu.cpu().numpy() + noise, -1.0, 1.0).astype(np.float32)
            ou_state[autoreset] = 0.0  # the env ignores this row's action: a new episode's noise starts at 0
            obs, rewards, terminated, truncated, next_autoreset = step_and_store(envs, rb, obs, u, autoreset)
            if args.normalize_obs:  # the moments are used, and saved, only with the flag
                net.observe(obs)
            ep_return, ep_length = ep_return + rewards * ~autoreset, ep_length + ~autoreset  # a reset step belongs to no episode
            autoreset = next_autoreset
            prev_step, global_step = global_step, global_step + args.num_envs
            for i in np.flatnonzero(autoreset):
                log.episode(global_step, ep_return[i], ep_length[i])
                ep_return[i], ep_length[i] = 0.0, 0

            if global_step >= args.learning_starts and rb.size >= args.batch_size:
                for _ in range(args.updates_per_step * args.num_envs):
                    loss, td, q = update(nets, target_nets, optimizer, rb.sample(args.batch_size, rng, device), args.gamma, args.tau, args.max_grad_norm, args.curvature_floor, args.pre_tanh_penalty, args.target_noise)
                    num_updates += 1
                log.check_finite(loss, global_step)
                if every(global_step, prev_step, 100):  # as CleanRL
                    log.scalars(global_step, {"losses/td_loss": td, "losses/q_values": q.mean()})
            if every(global_step, prev_step, 1000) or global_step >= args.total_steps or stop:
                log.scalars(global_step, {"charts/SPS": log.sps(global_step), "charts/learning_rate": args.learning_rate})
            if stop:  # save right away: no evaluation, no periodic checkpoint
                break
            if every(global_step, prev_step, args.eval_interval) and global_step < args.total_steps:
                log.scalars(global_step, {"eval/episodic_return": np.mean(evaluate(net, args.env_id, args.eval_episodes, args.seed, device))})
            if every(global_step, prev_step, args.checkpoint_interval):
                save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(nets, target_nets, optimizer, rb, ou_state, num_updates, rng))
            log.progress(global_step, args.total_steps)
        envs.close()
        if stop:
            save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(nets, target_nets, optimizer, rb, ou_state, num_updates, rng))
            return log.interrupted(global_step)
        returns = evaluate(net, args.env_id, args.eval_episodes, args.seed, device, log.run_dir / "videos" if args.capture_video else None)
        log.scalars(global_step, {"eval/episodic_return": np.mean(returns)})
        save_checkpoint(log.checkpoint, args, global_step, checkpoint_state(nets, target_nets, optimizer, rb, ou_state, num_updates, rng))
        log.summary(global_step, returns, num_updates=num_updates)


# ---------------------------------------------------------------- evaluation
def evaluate(net: NAFNetwork, env_id: str, episodes: int, seed: int, device, video_dir: Path | None = None) -> list[float]:
    """Deterministic returns, u = mu(x) (detail 7)."""
    env = make_env(env_id, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        env = gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda _: True, disable_logger=True)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done, total = False, 0.0
        while not done:
            with torch.inference_mode():
                _, mu, _, _ = net(torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0))
            obs, r, terminated, truncated, _ = env.step(scale_action(mu[0].cpu().numpy(), env.action_space.low, env.action_space.high))
            total, done = total + float(r), terminated or truncated
        returns.append(total)
    env.close()
    return returns


def eval_only(args: Args) -> None:
    """Evaluate --checkpoint with its own env, network and seed: it repeats the run's final evaluation."""
    ckpt, device = load_checkpoint(args.checkpoint), pick_device(args.device)
    with make_env(ckpt["env_id"]) as env:  # its spaces size the network
        net = NAFNetwork(int(np.prod(env.observation_space.shape)), env.action_space.shape[0], ckpt["args"]["hidden_dim"], normalize_obs=ckpt["args"].get("normalize_obs", False),
                         layer_norm=ckpt["args"].get("layer_norm", False)).to(device)
    net.load_state_dict(ckpt["net"])
    run_dir = run_dir_for(args, args.checkpoint)
    video_dir = run_dir / "videos" if args.capture_video else None
    write_eval_only(run_dir, args, ckpt, evaluate(net, ckpt["env_id"], args.eval_episodes, ckpt["args"]["seed"], device, video_dir))


# ===== run harness: the same text, byte for byte, in every file of algos/ (tests/test_harness.py compares them). No algorithm
# knowledge below (errors, checks, device, seeding, checkpoints, RNG state, signals, intervals, logger). Change it in one file, copy to all.
SCRIPT, ALGO = Path(__file__).name, Path(__file__).stem
PROCESS_START = time.time()  # summary.json's wall_time_s counts from here (imports done)


def fail(message: str) -> SystemExit:
    """`raise fail(...)`: one line on stderr, exit status 1 (bad input stops before training)."""
    return SystemExit(f"{SCRIPT}: error: {message}")


def check_args(args, rows: list[tuple[bool, str]]) -> None:
    """Stop at the first false (condition, message) row, common flags first; all rows are computed first, so each must be safe on bad input."""
    common = [
        (args.total_steps > 0, f"--total-steps must be positive, got {args.total_steps}"),
        (args.eval_episodes >= 1, f"--eval-episodes must be at least 1, got {args.eval_episodes}"),
        (min(args.eval_interval, args.checkpoint_interval) >= 0, "--eval-interval and --checkpoint-interval must be >= 0 (0: only at the end)"),
        (not args.eval_only or args.checkpoint is not None, "--eval-only needs --checkpoint PATH"),
        (not (args.eval_only and args.resume), "--eval-only evaluates --checkpoint and cannot --resume; drop one"),
        (args.device != "cuda" or torch.cuda.is_available(), "--device cuda but CUDA is not available; use --device cpu or auto"),
        (not args.track or importlib.util.find_spec("wandb") is not None, "--track needs wandb (pip install wandb), or drop --track"),
    ]
    for ok, message in common + rows:
        if not ok:
            raise fail(message)


def pick_device(name: str) -> torch.device:  # "cuda" without CUDA is refused by check_args
    return torch.device("cuda" if name == "cuda" or (name == "auto" and torch.cuda.is_available()) else "cpu")


def seed_everything(seed: int, deterministic: bool) -> None:
    """Seed the global generators; --torch-deterministic asks for deterministic kernels."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, read when CUDA starts
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # CPU and every CUDA device
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.backends.cudnn.deterministic = deterministic


def rng_state(**generators) -> dict:
    """Exactly the generators a file draws from (numpy or torch ones), plus CUDA's when CUDA is in use."""
    state = {name: g.bit_generator.state if isinstance(g, np.random.Generator) else g.get_state()
             for name, g in generators.items()}
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict, **generators) -> None:
    for name, g in generators.items():  # a numpy Generator's state is a dict, a torch Generator's a tensor
        g.set_state(state[name]) if isinstance(g, torch.Generator) else setattr(g.bit_generator, "state", state[name])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def save_checkpoint(path: Path, args, global_step: int, state: dict) -> None:
    """Plain tensors and containers, written to a temporary file and renamed: a kill leaves the last one whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"algo": ALGO, "harness": 1, "env_id": args.env_id, "args": asdict(args), "global_step": global_step, **state}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str, env_id: str | None = None) -> dict:
    """Loaded on the CPU with weights_only=True (a stranger's checkpoint cannot run code); the algorithm
    moves what it needs to its device. Refuses another script's or another environment's checkpoint."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # mapped: a replay is read when used
    except FileNotFoundError:
        raise fail(f"checkpoint {path} does not exist; pass the path of a checkpoints/latest.pt")
    except Exception as e:
        raise fail(f"cannot read checkpoint {path} ({type(e).__name__}); it is corrupt or not a checkpoint")
    if not isinstance(ckpt, dict) or not {"algo", "env_id", "args", "global_step"} <= ckpt.keys():
        raise fail(f"{path} is not a checkpoint written by this library; pass a checkpoints/latest.pt")
    elif ckpt["algo"] != ALGO:
        raise fail(f"checkpoint {path} was written by {ckpt['algo']}.py, not {SCRIPT}; use {ckpt['algo']}.py")
    if env_id is not None and ckpt["env_id"] != env_id:
        raise fail(f"checkpoint {path} is for {ckpt['env_id']}, not {env_id}; pass --env-id {ckpt['env_id']}")
    return ckpt


def resume_checkpoint(args, same: tuple[str, ...]) -> dict:
    """--resume's checkpoint; refused below its step or when an argument in `same` (sizes of what it holds) differs."""
    ckpt = load_checkpoint(args.resume, args.env_id)
    if ckpt.get("harness") != 1:
        raise fail(f"checkpoint {args.resume} was written by an older {SCRIPT} whose checkpoints this one cannot continue; resume it with that version")
    if args.total_steps < ckpt["global_step"]:
        raise fail(f"--total-steps {args.total_steps} is below the checkpoint's step {ckpt['global_step']}; pass at least that")
    for key in same:
        flag, theirs = "--" + key.replace("_", "-"), ckpt["args"].get(key)
        was = (flag if theirs else "--no-" + flag[2:]) if isinstance(theirs, bool) else f"{flag} {theirs}"  # tyro spells a boolean --x / --no-x
        if theirs != getattr(args, key):  # an older checkpoint may lack a flag added since: say so, no KeyError
            raise fail(f"checkpoint {args.resume} " + (f"was made with {was}, not {getattr(args, key)}; pass {was}" if key in ckpt["args"]
                                                        else f"predates {flag}; continue it with the {SCRIPT} that wrote it"))
    return ckpt


def run_dir_for(args, checkpoint: str | None) -> Path:
    """--run-dir if given; for a resume or --eval-only, the folder that holds the checkpoint's
    checkpoints/ folder where it lies now; else runs/<env>__<exp>__<seed>__<unix time>."""
    if args.run_dir:
        return Path(args.run_dir)
    if checkpoint:
        folder = Path(checkpoint).resolve().parent
        return folder.parent if folder.name == "checkpoints" else folder
    return Path(f"runs/{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}")


def write_eval_only(run_dir: Path, args, ckpt: dict, returns: list[float], **extra) -> None:
    """eval.json of --eval-only, beside the run's own outputs."""
    result = {"script": SCRIPT, "algo": ALGO, "env_id": ckpt["env_id"], "seed": ckpt["args"]["seed"],
              "checkpoint": str(args.checkpoint), "global_step": ckpt["global_step"], **eval_stats(returns), **extra}
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "eval.json", result)
    print(f"eval at step {ckpt['global_step']:,}: {result['eval_mean']:.2f} +- {result['eval_std']:.2f} -> {run_dir / 'eval.json'}")


def eval_stats(returns: list[float]) -> dict:  # the evaluation fields of summary.json and eval.json
    return {"eval_mean": float(np.mean(returns)), "eval_std": float(np.std(returns)),
            "eval_episodes": len(returns), "eval_returns": [float(r) for r in returns]}


class StopSignal:
    """True after the first SIGINT or SIGTERM (the loop checkpoints and leaves); a second one kills at once."""

    def __init__(self):
        self.signum = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, _frame) -> None:
        self.signum = signum
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)

    def __bool__(self) -> bool:
        return self.signum is not None


def every(step: int, previous_step: int, interval: int) -> bool:
    """True when a multiple of `interval` lies in (previous_step, step]; never when interval is 0."""
    return interval > 0 and step // interval != previous_step // interval


class RunLogger:
    """TensorBoard events (and W&B with --track), config.json, the progress line and summary.json of
    one run. `with RunLogger(...) as log:` finishes the W&B run with the right exit code on every way out.
    SPS counts this process's env steps over its training loop: the last sps() call marks the loop's end."""

    def __init__(self, args, run_dir: Path, start_step: int, resumed: bool, **config):
        self.args, self.run_dir, self.start_step = args, run_dir, start_step
        self.checkpoint = run_dir / "checkpoints" / "latest.pt"
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / "config.json", {**asdict(args), "run_dir": str(run_dir), **config})
        self.wandb = importlib.import_module("wandb") if args.track else None  # optional: imported only when asked
        if self.wandb is not None:
            self.wandb.init(project=args.wandb_project_name, config={**asdict(args), **config}, sync_tensorboard=True,
                            dir=str(run_dir), name=run_dir.name, mode=os.environ.get("WANDB_MODE", "online"), resume="allow")
        # purge_step: points after the checkpoint's step came from after the save; hide them on resume.
        self.writer = SummaryWriter(str(run_dir), purge_step=start_step + 1 if resumed else None)
        if not resumed:
            table = "\n".join(f"|{k}|{v}|" for k, v in {**asdict(args), **config}.items())
            self.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
        self.recent: deque = deque(maxlen=20)
        self.loop_start = self.loop_end = self.last_print = time.time()

    def __enter__(self) -> "RunLogger":
        return self

    def __exit__(self, kind, error, _traceback) -> None:
        self.writer.close()
        if self.wandb is not None:
            failed = kind is not None and not (kind is SystemExit and error.code in (0, None))
            self.wandb.finish(exit_code=1 if failed else 0)

    def scalars(self, step: int, values: dict) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, float(value), step)

    def episode(self, step: int, episodic_return: float, length: int) -> None:
        self.scalars(step, {"charts/episodic_return": episodic_return, "charts/episodic_length": length})
        self.recent.append(float(episodic_return))

    def sps(self, step: int) -> float:
        self.loop_end = time.time()
        return (step - self.start_step) / max(self.loop_end - self.loop_start, 1e-9)

    def progress(self, step: int, total_steps: int) -> None:
        if time.time() - self.last_print < 5:
            return
        self.last_print = time.time()
        sps, ret = self.sps(step), f"{np.mean(self.recent):.1f}" if self.recent else "n/a"
        eta = (total_steps - step) / max(sps, 1e-9)
        print(f"step {step:,}/{total_steps:,} | {sps:.0f} SPS | return {ret} | eta {int(eta // 3600)}h{int(eta % 3600 // 60):02d}m", flush=True)

    def check_finite(self, value: torch.Tensor, step: int) -> None:
        if not torch.isfinite(value).all():
            raise fail(f"non-finite loss at step {step:,} (the last good checkpoint, if any, is kept: {self.checkpoint}); try lower learning rates")

    def interrupted(self, step: int) -> None:
        print(f"interrupted: checkpoint saved at step {step:,} to {self.checkpoint}; continue with --resume {self.checkpoint}", flush=True)

    def summary(self, step: int, returns: list[float], **extra) -> None:
        """summary.json, written only by a finished run (its presence means "finished")."""
        write_json(self.run_dir / "summary.json", {
            "script": SCRIPT, "algo": ALGO, "env_id": self.args.env_id, "seed": self.args.seed, "global_step": step,
            **eval_stats(returns), "wall_time_s": time.time() - PROCESS_START,
            "sps": (step - self.start_step) / max(self.loop_end - self.loop_start, 1e-9),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **extra})
        print(f"done: {step:,} steps, eval {np.mean(returns):.2f} +- {np.std(returns):.2f} -> {self.run_dir}", flush=True)

if __name__ == "__main__":
    train(tyro.cli(Args))
