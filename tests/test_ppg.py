"""Tests of algos/ppg.py: GAE with truncation and autoreset, the auxiliary phase's
losses and gradients per architecture, phase bookkeeping across resume, and the
usual end-to-end contract (tiny runs, copy-alone, determinism, bad input)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import pytest
import torch

from conftest import ALGOS, check_error, check_ok, copy_alone, run_script, scalars, summary

spec = importlib.util.spec_from_file_location("ppg", ALGOS / "ppg.py")
ppg = importlib.util.module_from_spec(spec)
sys.modules["ppg"] = ppg  # dataclasses look the module up while the file executes
spec.loader.exec_module(ppg)

TINY = ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--n-pi", "3",
        "--e-pi", "2", "--e-v", "2", "--e-aux", "2", "--aux-num-minibatches", "4", "--eval-episodes", "2"]


def tags_equal(dir_a, dir_b, tags):
    for tag in tags:
        a, b = scalars(dir_a, tag), scalars(dir_b, tag)
        assert a, f"no {tag}"
        assert a == b, f"{tag} differs"


# ------------------------------------------------------------------- math
def test_gae_truncation_termination_and_autoreset_step():
    g, lam = 0.9, 0.8
    # t0 ordinary, t1 truncated, t2 the autoreset step (not a transition), t3 ordinary, t4 terminated.
    r = torch.tensor([1.0, 2.0, 0.0, 3.0, 4.0]).unsqueeze(1)
    v = torch.tensor([0.5, 0.7, 0.9, 1.1, 1.3]).unsqueeze(1)  # v[2] = V(real final obs of episode 1)
    term = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0]).unsqueeze(1)
    done = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0]).unsqueeze(1)
    A = ppg.gae(r, v, torch.tensor([5.0]), term, done, g, lam)[:, 0]
    a4 = 4.0 - 1.3                                   # termination: no bootstrap
    a3 = 3.0 + g * 1.3 - 1.1 + g * lam * a4
    a1 = 2.0 + g * 0.9 - 0.7                         # truncation: bootstrap V(final obs), trace cut
    a0 = 1.0 + g * 0.7 - 0.5 + g * lam * a1
    for t, expected in [(0, a0), (1, a1), (3, a3), (4, a4)]:
        assert A[t].item() == pytest.approx(expected, abs=1e-6)


def test_gae_matches_per_env_loop():
    torch.manual_seed(0)
    T, N, g, lam = 7, 3, 0.97, 0.9
    r, v, nv = torch.randn(T, N), torch.randn(T, N), torch.randn(N)
    done = (torch.rand(T, N) < 0.3).float()
    term = done * (torch.rand(T, N) < 0.5).float()
    A = ppg.gae(r, v, nv, term, done, g, lam)
    for n in range(N):
        for t in range(T):  # forward sum of discounted TD errors until the episode ends
            total, coef, k = 0.0, 1.0, t
            while k < T:
                v_next = nv[n] if k == T - 1 else v[k + 1, n]
                total += coef * (r[k, n] + g * v_next * (1 - term[k, n]) - v[k, n])
                if done[k, n]:
                    break
                coef *= g * lam
                k += 1
            assert A[t, n].item() == pytest.approx(float(total), abs=1e-5)


def test_reward_scale_statistics_match_numpy():
    rewards = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.0, 5.0]])
    dones = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    ret, carry = ppg.discounted_returns(rewards, dones, torch.tensor([10.0, 0.0]), 0.5)
    # env 0: 1 + 0.5*10 = 6, 3 + 0.5*6 = 6 (done), 0; env 1: 2 (done), 0, 5
    assert ret.tolist() == [[6.0, 2.0], [6.0, 0.0], [0.0, 5.0]] and carry.tolist() == [0.0, 5.0]
    xs = [torch.randn(50) * 3 + 1, torch.randn(20) - 2, torch.randn(7) * 10]
    moments = [0, 0.0, 1.0]
    for x in xs:
        moments = ppg.update_moments(moments, x)
    allx = torch.cat(xs)
    assert moments[0] == 77
    assert moments[1] == pytest.approx(allx.mean().item(), rel=1e-5)
    assert moments[2] == pytest.approx(allx.var(unbiased=False).item(), rel=1e-5)


def test_gradient_clipping_keeps_policy_and_value_apart():
    agent = make_agent("dual")
    for name, p in agent.named_parameters():  # value side gets a huge gradient
        p.grad = torch.full_like(p, 1000.0 if name.startswith("v_") else 1e-3)
    policy_before = {n: p.grad.clone() for n, p in agent.named_parameters() if not n.startswith("v_")}
    ppg.clip_grads(agent, 0.5)
    for n, g in policy_before.items():  # small policy gradient untouched
        assert torch.equal(dict(agent.named_parameters())[n].grad, g)
    value_norm = torch.stack([p.grad.norm() for n, p in agent.named_parameters() if n.startswith("v_")]).norm()
    assert value_norm.item() == pytest.approx(0.5, rel=1e-4)


def make_agent(arch, seed=0):
    torch.manual_seed(seed)
    return ppg.Agent(4, 3, 16, arch)


def test_kl_distillation_is_zero_when_policy_matches_pi_old():
    agent = make_agent("dual")
    obs = torch.randn(64, 4)
    logits_old = agent.logits(obs).detach()
    logits, value, aux = agent(obs)
    kl, _, _ = ppg.aux_losses(logits, value, aux, logits_old, torch.zeros(64), torch.ones(64))
    assert abs(kl.item()) < 1e-6
    kl.backward()
    for name, p in agent.named_parameters():
        assert p.grad is None or p.grad.abs().max().item() < 1e-6, name
    # A gradient step on this loss leaves the policy where it is (float rounding aside; Adam
    # would rescale rounding noise, so plain SGD shows it) ...
    before = agent.logits(obs).detach()
    torch.optim.SGD(agent.parameters(), lr=1.0).step()
    assert torch.allclose(agent.logits(obs), before, atol=1e-6)
    # ... while a different pi_old gives a non-zero gradient (the check can fail).
    agent.zero_grad()
    logits, value, aux = agent(obs)
    ppg.aux_losses(logits, value, aux, logits_old + torch.randn_like(logits_old), torch.zeros(64), torch.ones(64))[0].backward()
    assert agent.pi_head.weight.grad.abs().max().item() > 1e-4


def test_categorical_kl_matches_torch():
    a, b = torch.randn(10, 5), torch.randn(10, 5)
    ref = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=a), torch.distributions.Categorical(logits=b))
    assert torch.allclose(ppg.categorical_kl(a, b), ref, atol=1e-6)


@pytest.mark.parametrize("arch", ["dual", "shared"])
def test_auxiliary_phase_fits_value_targets_and_keeps_policy(arch):
    agent = make_agent(arch)
    obs = torch.randn(512, 4)
    v_targ = 3.0 * obs[:, 0] - 2.0 * obs[:, 1] ** 2 + 5.0
    valid = torch.ones(512)
    valid[::7] = 0.0  # autoreset steps carry no target
    logits_old = agent.logits(obs).detach()

    def errors():
        with torch.no_grad():
            _, value, aux = agent(obs)
            m = valid.bool()
            return ((aux - v_targ)[m] ** 2).mean().item(), ((value - v_targ)[m] ** 2).mean().item()

    aux_before, v_before = errors()
    args = ppg.Args(e_aux=6, aux_num_minibatches=8, max_grad_norm=10.0)
    opt = torch.optim.Adam(agent.parameters(), lr=1e-2, eps=1e-5)
    stats = ppg.auxiliary_phase(agent, opt, obs, v_targ, valid, args)
    aux_after, v_after = errors()
    assert aux_after < 0.5 * aux_before and v_after < 0.5 * v_before
    assert set(stats) == {"kl", "aux_value", "value"}
    kl = ppg.categorical_kl(logits_old, agent.logits(obs).detach()).mean().item()
    assert kl < 0.05  # beta_clone keeps the policy close to pi_old


def grad_groups(agent, loss):
    """Names of the parameter groups that receive a non-zero gradient from `loss`."""
    agent.zero_grad(set_to_none=True)
    loss.backward(retain_graph=True)
    groups = set()
    for name, p in agent.named_parameters():
        if p.grad is not None and p.grad.abs().max().item() > 0:
            groups.add(name.split(".")[0])
    return groups


@pytest.mark.parametrize("arch", ["dual", "shared"])
def test_each_loss_trains_only_its_parameters(arch):
    agent = make_agent(arch)
    obs = torch.randn(32, 4)
    ones = torch.ones(32)
    logits, value, aux = agent(obs)
    pg, v_loss, entropy, _, _ = ppg.ppo_losses(logits, value, torch.randint(0, 3, (32,)), torch.full((32,), -1.1),
                                                torch.randn(32), torch.randn(32), ones, 0.2)
    kl, aux_v, v_aux_phase = ppg.aux_losses(logits, value, aux, torch.randn(32, 3), torch.randn(32), ones)
    policy = {"pi_body", "pi_head"}
    value_net = {"v_body", "v_head"} if arch == "dual" else {"v_head"}  # shared: trunk detached
    assert grad_groups(agent, pg) == policy
    assert grad_groups(agent, entropy) == policy
    assert grad_groups(agent, v_loss) == value_net
    assert grad_groups(agent, kl) == policy
    assert grad_groups(agent, aux_v) == {"pi_body", "aux_head"}
    assert grad_groups(agent, v_aux_phase) == value_net


def test_policy_phase_trains_policy_for_e_pi_epochs_only():
    torch.manual_seed(1)
    n = 64
    batch = {"obs": torch.randn(n, 4), "actions": torch.randint(0, 3, (n,)), "logprobs": torch.full((n,), -1.1),
             "advantages": torch.randn(n), "returns": torch.randn(n), "valid": torch.ones(n)}
    results = []
    for e_v in (1, 3):
        agent = make_agent("dual")
        opt = torch.optim.Adam(agent.parameters(), lr=1e-2, eps=1e-5)
        torch.manual_seed(2)
        ppg.policy_phase(agent, opt, batch, ppg.Args(e_pi=1, e_v=e_v, num_minibatches=2))
        results.append(agent.state_dict())
    for name in results[0]:
        same = torch.equal(results[0][name], results[1][name])
        assert same == (not name.startswith("v_")), name


# ------------------------------------------------------------ end to end
@pytest.mark.slow
def test_tiny_run_outputs_and_checkpoint(tmp_run):
    check_ok(run_script("ppg.py", "--total-steps", "640", "--eval-interval", "320", "--run-dir", str(tmp_run), *TINY))
    s = summary(tmp_run)
    for key in ("script", "algo", "env_id", "seed", "global_step", "eval_mean", "eval_std", "eval_episodes",
                "eval_returns", "wall_time_s", "sps", "peak_rss_mb", "aux_phase_time_fraction"):
        assert key in s, key
    assert s["script"] == "ppg.py" and s["global_step"] == 640 and s["eval_episodes"] == 2
    assert s["aux_phases"] == 3  # 10 iterations, N_pi 3
    assert json.loads((tmp_run / "config.json").read_text())["n_pi"] == 3
    for tag in ("charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate",
                "losses/policy_loss", "losses/value_loss", "losses/entropy", "charts/aux_phase_time_fraction"):
        assert scalars(tmp_run, tag), tag
    assert [step for step, _ in scalars(tmp_run, "losses/aux/kl")] == [192, 384, 576]
    assert [step for step, _ in scalars(tmp_run, "eval/episodic_return")] == [320, 640]
    ckpt = torch.load(tmp_run / "checkpoints" / "latest.pt", weights_only=True)
    assert ckpt["algo"] == "ppg" and ckpt["global_step"] == 640 and ckpt["phase_iteration"] == 1
    assert ckpt["aux_obs"].shape == (1, 64, 4) and "aux_optimizer" in ckpt and "optimizer" in ckpt

    # --seed and --env-id are the checkpoint's, so this repeats the run's own final evaluation.
    proc = run_script("ppg.py", "--eval-only", "--checkpoint", str(tmp_run / "checkpoints" / "latest.pt"),
                      "--eval-episodes", "1", "--capture-video", "--seed", "7", "--env-id", "Acrobot-v1")
    check_ok(proc)
    result = json.loads((tmp_run / "eval.json").read_text())
    assert result["eval_episodes"] == 1 and result["global_step"] == 640 and result["env_id"] == "CartPole-v1"
    assert result["eval_returns"] == s["eval_returns"][:1]
    assert list((tmp_run / "videos").glob("*.mp4"))


@pytest.mark.slow
def test_copy_alone_shared_arch(tmp_path):
    script = copy_alone("ppg.py", tmp_path / "alone")
    proc = run_script(script, "--total-steps", "256", "--arch", "shared", "--eval-interval", "0", *TINY,
                      cwd=tmp_path / "alone")
    check_ok(proc)
    (run,) = (tmp_path / "alone" / "runs").iterdir()
    assert run.name.startswith("CartPole-v1__ppg__1__")
    assert summary(run)["global_step"] == 256


@pytest.mark.slow
def test_resume_mid_phase_matches_uninterrupted_run(tmp_path):
    # --norm-reward: its running statistics must resume too.
    common = [*TINY, "--no-anneal-lr", "--norm-reward", "--eval-interval", "0", "--checkpoint-interval", "0"]
    full, part = tmp_path / "full", tmp_path / "part"
    check_ok(run_script("ppg.py", "--total-steps", "1024", "--run-dir", str(full), *common))
    check_ok(run_script("ppg.py", "--total-steps", "448", "--run-dir", str(tmp_path / "first"), *common))
    ckpt = torch.load(tmp_path / "first" / "checkpoints" / "latest.pt", weights_only=True)
    assert ckpt["phase_iteration"] == 1 and ckpt["aux_phases"] == 2  # 7 iterations: mid-phase
    # The run folder is moved before the resume: output goes beside the checkpoint, not to the stored path.
    shutil.move(tmp_path / "first", part)
    check_ok(run_script("ppg.py", "--total-steps", "1024", "--resume", str(part / "checkpoints" / "latest.pt"), *common))
    assert summary(part)["global_step"] == 1024 and not (tmp_path / "first").exists()
    assert [s for s, _ in scalars(part, "losses/aux/kl")] == [192, 384, 576, 768, 960]
    tags_equal(full, part, ["losses/aux/kl", "losses/aux/aux_value", "losses/aux/value", "losses/policy_loss",
                            "losses/value_loss", "charts/episodic_return"])
    assert summary(part)["eval_returns"] == summary(full)["eval_returns"]


@pytest.mark.slow
def test_same_seed_same_metrics(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        check_ok(run_script("ppg.py", "--total-steps", "384", "--eval-interval", "0", "--run-dir", str(d), *TINY))
    tags_equal(*dirs, ["losses/policy_loss", "losses/value_loss", "losses/aux/kl", "charts/episodic_return"])
    assert summary(dirs[0])["eval_returns"] == summary(dirs[1])["eval_returns"]


@pytest.mark.slow
def test_sigterm_saves_checkpoint_and_exits_cleanly(tmp_run):
    cmd = [sys.executable, str(ALGOS / "ppg.py"), "--total-steps", "10000000", "--run-dir", str(tmp_run),
           "--checkpoint-interval", "0", "--eval-interval", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.stdout.readline().startswith("step ")  # training has started
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "checkpoint saved" in out
    ckpt = torch.load(tmp_run / "checkpoints" / "latest.pt", weights_only=True)
    assert 0 < ckpt["global_step"] < 10_000_000
    assert not (tmp_run / "summary.json").exists()


# ------------------------------------------------------------- bad input
@pytest.mark.parametrize("args, fragments", [
    (["--env-id", "NoSuchEnv-v9"], ["unknown environment", "NoSuchEnv-v9"]),
    (["--num-minibatches", "3"], ["--num-minibatches", "does not divide"]),
])
def test_bad_input_one_line_on_stderr(args, fragments, tmp_run):
    check_error(run_script("ppg.py", "--run-dir", str(tmp_run), *args), *fragments)
    assert not tmp_run.exists()


def refused(tmp_path, **kwargs) -> str:
    """The SystemExit message of train(Args(**kwargs)) (in-process: the same code path
    as the command line, without a torch import per case); nothing may be written."""
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        ppg.train(ppg.Args(run_dir=str(run_dir), **kwargs))
    assert not run_dir.exists()
    message = str(exc.value.code)
    assert message.startswith("ppg.py: error: ") and "\n" not in message
    return message


@pytest.mark.parametrize("kwargs, fragments", [
    ({"env_id": "Pendulum-v1"}, ["continuous actions", "d4pg.py", "naf.py", "rlpd.py"]),
    ({"env_id": "CarRacing-v3"}, ["image observations", "ppo_atari.py"]),
    ({"env_id": "FrozenLake-v1"}, ["flat Box"]),
    ({"env_id": "ALE/Pong-v5"}, ["ppo_atari.py"]),
    ({"aux_num_minibatches": 3}, ["--aux-num-minibatches", "does not divide"]),
    ({"total_steps": 100}, ["--total-steps", "below one rollout"]),
    ({"n_pi": 0}, ["--n-pi"]),
    ({"e_pi": 0}, ["--e-pi"]),
    ({"e_aux": -1}, ["--e-aux"]),
    ({"eval_only": True}, ["--checkpoint"]),
    ({"eval_only": True, "checkpoint": "/nonexistent/latest.pt", "eval_episodes": 0}, ["--eval-episodes"]),
    ({"eval_only": True, "checkpoint": "/nonexistent/latest.pt", "eval_episodes": -2}, ["--eval-episodes"]),
    ({"resume": "/nonexistent/latest.pt"}, ["does not exist"]),
])
def test_bad_input(kwargs, fragments, tmp_path):
    message = refused(tmp_path, **kwargs)
    for fragment in fragments:
        assert fragment in message


def test_bad_checkpoints(tmp_path):
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    check_error(run_script("ppg.py", "--resume", str(corrupt)), "corrupt")
    other = tmp_path / "other.pt"
    torch.save({"algo": "dqn", "args": {}}, other)
    assert "dqn" in refused(tmp_path, eval_only=True, checkpoint=str(other))
    mine = tmp_path / "mine.pt"
    torch.save({"algo": "ppg", "args": ppg.asdict(ppg.Args())}, mine)
    for change, flag in [({"arch": "shared"}, "--arch dual"), ({"num_envs": 4}, "--num-envs 8"),
                         ({"n_pi": 4}, "--n-pi 8"), ({"env_id": "Acrobot-v1"}, "--env-id CartPole-v1"),
                         ({"e_aux": 0}, "--e-aux 6")]:
        assert flag in refused(tmp_path, resume=str(mine), **change)
    torch.save({"algo": "ppg", "args": ppg.asdict(ppg.Args()), "global_step": 4096}, mine)
    message = refused(tmp_path, resume=str(mine), total_steps=4000)
    assert "--total-steps 4,000 is below the checkpoint's step 4,096" in message


def test_checkpoint_run_dir_comes_from_the_files_location(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ppg.checkpoint_run_dir("runs/a/checkpoints/latest.pt") == str(tmp_path / "runs" / "a")
    assert ppg.checkpoint_run_dir(str(tmp_path / "elsewhere" / "x.pt")) == str(tmp_path / "elsewhere")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")
def test_cuda_requested_without_cuda(tmp_path):
    assert "CUDA" in refused(tmp_path, device="cuda")


# ------------------------------------------- exit paths, in process (fast)
@pytest.fixture
def in_process(tmp_path, monkeypatch):
    """train() in this process with a fake wandb; records the order of wandb.init, the
    SummaryWriter, evaluations and wandb.finish. Restores pytest's signal handlers."""
    events = []
    fake = types.SimpleNamespace(init=lambda **kw: events.append("init"),
                                 finish=lambda exit_code=None: events.append(("finish", exit_code)))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    real_writer, real_evaluate = ppg.SummaryWriter, ppg.evaluate
    monkeypatch.setattr(ppg, "SummaryWriter", lambda *a, **kw: events.append("writer") or real_writer(*a, **kw))

    def evaluate(*a, **kw):
        events.append("eval")
        return real_evaluate(*a, **kw)

    monkeypatch.setattr(ppg, "evaluate", evaluate)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    run_dir = tmp_path / "run"

    def run(**kwargs):
        tiny = dict(run_dir=str(run_dir), track=True, torch_deterministic=False, num_envs=4, num_steps=16,
                    num_minibatches=2, n_pi=2, e_pi=1, e_v=1, e_aux=1, aux_num_minibatches=2,
                    eval_episodes=1, eval_interval=64)
        ppg.train(ppg.Args(**{**tiny, **kwargs}))

    yield types.SimpleNamespace(run=run, events=events, run_dir=run_dir)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def test_wandb_starts_before_the_writer_and_finishes(in_process):
    in_process.run(total_steps=128)
    assert in_process.events == ["init", "writer", "eval", "eval", ("finish", 0)]  # eval at 64 and the final one


def test_non_finite_loss_finishes_wandb(in_process, monkeypatch):
    monkeypatch.setattr(ppg, "policy_phase", lambda *a: {"policy_loss": math.nan})
    with pytest.raises(SystemExit, match="non-finite loss"):
        in_process.run(total_steps=128)
    assert in_process.events == ["init", "writer", ("finish", 1)]


def test_signal_skips_evaluations_saves_and_second_signal_kills(in_process, monkeypatch):
    real_phase = ppg.policy_phase

    def phase_then_sigterm(*a):  # SIGTERM arrives during the first update
        os.kill(os.getpid(), signal.SIGTERM)
        return real_phase(*a)

    monkeypatch.setattr(ppg, "policy_phase", phase_then_sigterm)
    in_process.run(total_steps=6400)
    assert in_process.events == ["init", "writer", ("finish", 0)]  # no evaluation after the signal
    assert torch.load(in_process.run_dir / "checkpoints" / "latest.pt", weights_only=True)["global_step"] == 64
    assert not (in_process.run_dir / "summary.json").exists()
    assert signal.getsignal(signal.SIGINT) == signal.SIG_DFL and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_checkpoint_interval_saves_once_per_crossing_and_once_at_the_end(in_process, monkeypatch):
    real_save, saved = ppg.save_checkpoint, []
    monkeypatch.setattr(ppg, "save_checkpoint", lambda path, state: saved.append(state["global_step"]) or real_save(path, state))
    in_process.run(total_steps=192, checkpoint_interval=64)  # 3 iterations of 64 steps
    assert saved == [64, 128, 192]  # the last crossing is the final save, not a second one


def test_sps_counts_the_training_loop_and_wall_time_the_whole_run(in_process, monkeypatch):
    real_check_env, real_save = ppg.check_env, ppg.save_checkpoint

    def slow(seconds, fn=lambda *a: [1.0]):
        return lambda *a, **kw: time.sleep(seconds) or fn(*a, **kw)

    # 1 s of startup, 0.5 s final checkpoint (the only one), 1 s final evaluation (--eval-interval 0)
    monkeypatch.setattr(ppg, "check_env", slow(1.0, real_check_env))
    monkeypatch.setattr(ppg, "save_checkpoint", slow(0.5, real_save))
    monkeypatch.setattr(ppg, "evaluate", slow(1.0))
    in_process.run(total_steps=128, eval_interval=0, checkpoint_interval=0)
    s = summary(in_process.run_dir)
    loop_time = s["global_step"] / s["sps"]
    assert s["wall_time_s"] >= 2.5 and loop_time <= s["wall_time_s"] - 2.5
