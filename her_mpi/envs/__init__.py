"""Goal-conditioned environments: gymnasium-robotics ids plus the package's own goal envs.

``make_env`` builds an env from an :class:`~her_mpi.config.EnvConfig` and checks the goal-env
contract (dict observation with ``observation``/``achieved_goal``/``desired_goal``, a vectorised
``compute_reward``). :class:`EnvSpec` is everything the rest of the package needs to know about
an env: sizes, action space and bounds, horizon and control period.
"""

from __future__ import annotations

import contextlib
import difflib
import io
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from her_mpi.settings import ConfigError, EnvConfig

# Tested here with the pinned mujoco/gymnasium-robotics; other gymnasium goal envs also work.
ROBOTICS_ENVS = ("FetchReach-v4", "FetchPush-v4", "FetchPickAndPlace-v4", "FetchSlide-v4",
                 "HandReach-v3")
OWN_ENVS = {
    "BitFlipping-v0": "her_mpi.envs.bit_flipping:BitFlippingEnv",
    "PredatorPrey-v0": "her_mpi.envs.predator_prey:PredatorPreyEnv",
    # HTRPO's discrete-action Fetch tasks (velocity-difference control) and goal-conditioned Ms. Pac-Man
    "FetchReachDiscrete-v0": "her_mpi.envs.fetch_discrete:FetchDiscreteEnv",
    "FetchPushDiscrete-v0": "her_mpi.envs.fetch_discrete:FetchDiscreteEnv",
    "FetchSlideDiscrete-v0": "her_mpi.envs.fetch_discrete:FetchDiscreteEnv",
    "MsPacmanGoal-v0": "her_mpi.envs.ms_pacman:MsPacmanGoalEnv",
}
OWN_ENV_KWARGS = {env_id: {"task": env_id} for env_id in
                  ("FetchReachDiscrete-v0", "FetchPushDiscrete-v0", "FetchSlideDiscrete-v0")}
GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")


def register_envs() -> None:
    """Register gymnasium-robotics and our own envs with gymnasium (idempotent)."""
    for env_id, entry_point in OWN_ENVS.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=entry_point, kwargs=OWN_ENV_KWARGS.get(env_id, {}))
    with contextlib.redirect_stderr(io.StringIO()):  # its import prints an unrelated notice
        import gymnasium_robotics
    gym.register_envs(gymnasium_robotics)


def known_env_ids() -> list[str]:
    return list(ROBOTICS_ENVS) + list(OWN_ENVS)


@dataclass(frozen=True)
class EnvSpec:
    env_id: str
    obs_dim: int
    goal_dim: int
    discrete: bool
    action_dim: int  # continuous: size of the action vector; discrete: 1 (an index)
    n_actions: int  # discrete: number of actions; continuous: 0
    action_low: tuple  # continuous bounds per dimension (discrete: empty)
    action_high: tuple
    horizon: int  # steps per episode (T)
    control_period: float  # seconds between actions on the real system (env.dt), 0 if unknown
    # Per-step rewards at the goal and far from it, e.g. (-1, 0) sparse Fetch, (0, 1) predator-prey:
    # bounds the returns, which off-policy targets are clipped to.
    reward_bounds: tuple = (-1.0, 0.0)
    # Image observations: their (channels, height, width); () for flat vectors. Observations are
    # always stored flat (obs_dim values per step); networks for images reshape them.
    obs_shape: tuple = ()
    obs_dtype: str = "float32"  # "uint8" for images: stored as bytes, scaled at the network
    # Bounds of the desired goal per dimension where all are finite (predator-prey's arena), else ()
    goal_low: tuple = ()
    goal_high: tuple = ()


def make_env(cfg: EnvConfig, seed: int | None = None) -> gym.Env:
    register_envs()
    if cfg.id not in gym.registry:
        close = difflib.get_close_matches(cfg.id, list(gym.registry), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"env.id: unknown environment {cfg.id!r}.{hint} Known goal "
                          f"environments: {', '.join(known_env_ids())}")
    kwargs = dict(cfg.kwargs)
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    try:
        env = gym.make(cfg.id, disable_env_checker=True, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"env.kwargs: {cfg.id} rejected {cfg.kwargs!r}: {exc}") from None
    except ValueError as exc:  # our envs validate their parameters with ValueError
        raise ConfigError(f"env.kwargs: {exc}") from None
    check_goal_env(env, cfg.id)
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


def check_goal_env(env: gym.Env, env_id: str) -> None:
    space = env.observation_space
    if not isinstance(space, gym.spaces.Dict) or set(GOAL_KEYS) - set(space.spaces):
        raise ConfigError(f"env.id: {env_id} is not a goal environment: its observations must be "
                          f"a dict with keys {', '.join(GOAL_KEYS)}")
    if not isinstance(env.action_space, (gym.spaces.Box, gym.spaces.Discrete)):
        raise ConfigError(f"env.id: {env_id} has action space {env.action_space}; "
                          f"expected a Box or a Discrete space")
    goal = np.zeros((2,) + space["desired_goal"].shape, dtype=np.float32)
    reward = np.asarray(env.unwrapped.compute_reward(goal, goal, None))
    if reward.shape != (2,):
        raise ConfigError(f"env.id: {env_id}.compute_reward is not vectorised (a batch of 2 goals "
                          f"gave shape {reward.shape})")


def env_spec(env: gym.Env, env_id: str) -> EnvSpec:
    space = env.observation_space
    horizon = env.spec.max_episode_steps if env.spec is not None else None
    horizon = horizon or getattr(env.unwrapped, "horizon", None)  # our envs end episodes themselves
    if not horizon:
        raise ConfigError(f"env.max_episode_steps: {env_id} has no registered horizon; set one")
    action = env.action_space
    discrete = isinstance(action, gym.spaces.Discrete)
    observation = space["observation"]
    image = len(observation.shape) == 3
    goal_space = space["desired_goal"]
    bounded = isinstance(goal_space, gym.spaces.Box) and bool(np.isfinite(goal_space.low).all()
                                                               and np.isfinite(goal_space.high).all())
    return EnvSpec(
        env_id=env_id,
        obs_dim=int(np.prod(space["observation"].shape)),
        goal_dim=int(np.prod(space["desired_goal"].shape)),
        discrete=discrete,
        action_dim=1 if discrete else int(np.prod(action.shape)),
        n_actions=int(action.n) if discrete else 0,
        action_low=() if discrete else tuple(float(v) for v in action.low.ravel()),
        action_high=() if discrete else tuple(float(v) for v in action.high.ravel()),
        horizon=int(horizon),
        control_period=float(getattr(env.unwrapped, "dt", 0.0) or 0.0),
        reward_bounds=reward_bounds(env),
        obs_shape=tuple(int(d) for d in observation.shape) if image else (),
        obs_dtype="uint8" if observation.dtype == np.uint8 else "float32",
        goal_low=tuple(float(v) for v in goal_space.low.ravel()) if bounded else (),
        goal_high=tuple(float(v) for v in goal_space.high.ravel()) if bounded else (),
    )


def reward_bounds(env: gym.Env) -> tuple[float, float]:
    """(min, max) of the reward for a goal reached, a goal far away and running out of time
    (sparse goal envs; predator-prey's time-out pays -1, below its goal rewards 0/1)."""
    shape = env.observation_space["desired_goal"].shape
    goal = np.zeros(shape, dtype=np.float32)
    far = np.full(shape, 1e3, dtype=np.float32)
    rewards = np.asarray(env.unwrapped.compute_reward(np.stack([goal, far]), np.stack([goal, goal]), None),
                         dtype=np.float64)
    timeout = float(getattr(env.unwrapped, "timeout_reward", 0.0))
    return min(float(rewards.min()), timeout), max(float(rewards.max()), timeout)


@dataclass(frozen=True)
class GoalFunctions:
    """An env's goal arithmetic, vectorised over batches of (achieved, desired) goals."""

    reward: callable
    terminal: callable
    success: callable
    timeout_reward: float  # reward of running out of time (predator-prey: -1), not goal-dependent


def goal_functions(env: gym.Env) -> GoalFunctions:
    return GoalFunctions(reward=lambda ag, g: compute_reward(env, ag, g),
                         terminal=lambda ag, g: compute_terminated(env, ag, g),
                         success=lambda ag, g: compute_success(env, ag, g),
                         timeout_reward=float(getattr(env.unwrapped, "timeout_reward", 0.0)))


def compute_reward(env: gym.Env, achieved_goal: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
    """The env's own vectorised reward for a batch of (achieved, desired) goal pairs."""
    reward = env.unwrapped.compute_reward(achieved_goal, desired_goal, None)
    return np.asarray(reward, dtype=np.float32).reshape(len(achieved_goal))


def compute_terminated(env: gym.Env, achieved_goal: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
    """Whether reaching ``achieved_goal`` ends the episode (False for Fetch/Hand, which never end)."""
    terminated = env.unwrapped.compute_terminated(achieved_goal, desired_goal, None)
    return np.broadcast_to(np.asarray(terminated, dtype=np.float32), (len(achieved_goal),))


def compute_success(env: gym.Env, achieved_goal: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
    """1.0 where ``achieved_goal`` counts as reaching ``desired_goal`` (vectorised)."""
    unwrapped = env.unwrapped
    if hasattr(unwrapped, "compute_success"):  # our envs
        success = unwrapped.compute_success(achieved_goal, desired_goal)
    elif hasattr(unwrapped, "_is_success"):  # gymnasium-robotics Fetch and Hand envs
        success = unwrapped._is_success(achieved_goal, desired_goal)
    else:  # sparse -1/0 rewards: success is reward 0
        success = compute_reward(env, achieved_goal, desired_goal) >= 0
    return np.asarray(success, dtype=np.float32).reshape(len(achieved_goal))
