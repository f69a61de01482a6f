"""The life and FIRE protocol the three Atari files share (issue 14): `auto` resolves by the id's literature,
and the learning flags of one vector step under each protocol, against hand-written expectations. The
forcing of FIRE, its masking and evaluation are tested in each file's own module."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
from conftest import ALGOS

NAMES = ("ppo_atari", "recurrent_ppo_atari", "dqn_atari")


def module(name: str):
    """The algorithm file as a module, the one its test module loaded if it ran in this worker."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ALGOS / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(
            spec
        )  # dataclasses resolve annotations through it
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "protocol, env_id, resolved",
    [
        ("auto", "BreakoutNoFrameskip-v4", "baselines"),
        ("auto", "ALE/Breakout-v5", "machado"),
        ("machado", "BreakoutNoFrameskip-v4", "machado"),
        ("baselines", "ALE/Pong-v5", "baselines"),
    ],
)
def test_resolve_protocol(name, protocol, env_id, resolved):
    assert module(name).resolve_protocol(protocol, env_id) == resolved


@pytest.mark.parametrize("name", NAMES)
def test_learning_flags(name):
    """Env 0 goes on, 1 loses a life, 2 ends its game, 3 hits the time limit, 4 both (after a game end
    `lives` is the reset game's). A lost life is terminal only under baselines; a game over is never a lost
    life; the game over beats the time limit. dqn_atari returns (d, life lost), the PPO files also the cut."""
    term, trunc = (
        np.array([False, False, True, False, True]),
        np.array([False, False, False, True, True]),
    )
    lives, prev = np.array([3, 2, 5, 5, 5]), np.array([3, 3, 1, 2, 1])
    for baselines, terminal_expected in (
        (True, [False, True, True, False, True]),
        (False, [False, False, True, False, True]),
    ):
        flags = module(name).learning_flags(term, trunc, lives, prev, baselines)
        terminal, lost = flags[0], flags[-1]
        assert terminal.tolist() == terminal_expected
        assert lost.tolist() == [False, True, False, False, False]
        if len(flags) == 3:
            assert flags[1].tolist() == [False, False, False, True, False]
