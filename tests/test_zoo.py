"""The trained policies that ship in her_mpi_runtime/zoo: each loads as zoo:NAME, is the file its card
describes, and still succeeds as its card says on episodes of the card's own evaluation."""

import hashlib
import json
import subprocess
import sys

import pytest
from scipy import stats

from helpers import ROOT
from her_mpi_runtime import Policy, zoo

EPISODES = 20
# what a user of the zoo can count on: every robotics task, bit flipping, and (checked below) a discrete task
REQUIRED = {"FetchReach-v4", "FetchPush-v4", "FetchPickAndPlace-v4", "FetchSlide-v4", "HandReach-v3", "BitFlipping-v0"}


@pytest.mark.parametrize("name", zoo.names())
def test_a_zoo_policy_is_its_card_and_succeeds_as_it_says(name):
    card = zoo.card(name)
    data = zoo.resolve(f"zoo:{name}").read_bytes()
    assert hashlib.sha256(data).hexdigest() == card["sha256"] and len(data) == card["size_bytes"]
    policy = Policy(f"zoo:{name}")
    assert policy.metadata.env_id == card["env_id"] and policy.sha256 == card["sha256"]
    result = subprocess.run([sys.executable, "-m", "her_mpi.evaluate", "--policy", f"zoo:{name}", "--episodes",
                             str(EPISODES), "--seed", str(card["evaluation_seed"])],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    successes = round(json.loads(result.stdout)["success_rate"] * EPISODES)
    # fewer would happen with probability < 0.001 at the low end of the card's interval: a policy that
    # got worse fails (20 episodes cannot show a card that undersells a policy: its cards are near 1)
    low, _ = card["success_interval_95"]
    floor = stats.binom.ppf(0.001, EPISODES, low)
    assert successes >= floor, f"{successes}/{EPISODES} successes; the card says {card['success_rate']:.3f}"


def test_the_zoo_lists_itself():
    result = subprocess.run([sys.executable, "-m", "her_mpi_runtime.zoo"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for name in zoo.names():
        assert f"zoo:{name}" in result.stdout


def test_the_zoo_covers_the_robotics_tasks_a_discrete_task_and_bit_flipping():
    tasks = {zoo.card(name)["env_id"] for name in zoo.names()}
    missing = REQUIRED - tasks
    assert not missing, f"no zoo policy for {sorted(missing)}"
    assert any(Policy(f"zoo:{name}").metadata.discrete and zoo.card(name)["env_id"] != "BitFlipping-v0"
               for name in zoo.names()), "no discrete-action task besides bit flipping"
