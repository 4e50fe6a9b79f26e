"""HTRPO (the HTRPO paper, Hindsight Trust Region Policy Optimization) and HPG.

One iteration: choose hindsight goals from the batch's achieved goals (Hindsight Goal Filtering,
identical on every rank), rewrite every episode for every goal (each copy ends at its first
success; sparse reward T - t there, as in the authors' code; ``hold_goal`` runs copies to the
episode's end, paying T - t at every step at the goal, for envs judged at their last step: a
copy cut at its first success never teaches the policy to stay), weight each step by the
per-decision importance ratio rho_t = prod_k pi(a_k|s_k,g') / pi(a_k|s_k,g) of the collecting
policy, then

* HTRPO (``algo: htrpo``): maximise the weighted surrogate subject to the QKL constraint
  (conjugate gradient on Hessian-vector products of the constraint + damping, step
  sqrt(2 max_kl / x^T H x) x, backtracking line search);
* HPG (``algo: hpg``): a plain gradient step on the same weighted objective.

The advantages come from a critic V(s, g) (TD(0) by default, normalised), refit afterwards on its
TD(0) targets; with ``critic: false`` from the discounted importance-weighted returns instead (the
authors' critic-free FetchReachDiscrete setting). Every gradient, Hessian-vector product and
line-search value is summed over ranks, so every rank takes the same step.

Units of the objective and of ``max_kl`` are the paper's (eq. 79-80 of the HTRPO paper; the authors'
``mean_kl_divergence``): a sum over time steps, normalised by the number of trajectories,

    D = (1 - gamma) / N_traj * sum over (trajectory, t) of h * gamma^t * K_t,

with K_t = 1/2 (log pi_old - log pi)^2 (QKL), N_traj = N_episodes * (1 + N_goals) over all ranks
(N_episodes * N_goals with ``original_goals: false``), and h the per-decision ratio rho_t (1 under
the episodes' own goals) divided, with weighted importance sampling, by its sum over the episodes
for the same goal and step (``weighted_is: false``: rho_t itself; see importance_weights). The
sum-to-1 normalisation is the paper's: it makes D scale like 1 / N_episodes, so the paper's max_kl
(2e-5 for Fetch and Ms. Pac-Man, 1e-3 for bit flipping) means what it meant there at the paper's
batch sizes (1,600 steps for Fetch, 300 for Ms. Pac-Man). A mean over rows, as before, is
N_episodes / ((1 - gamma) * mean copy length) times larger: about 65x for 1,600-step Fetch batches.
The objective uses the same h * gamma^t / N_traj (the authors' HPG loss; for HTRPO its scale
does not matter, the step is sized by the constraint).

Ablations: ``kl: qkl | analytic | logratio``, ``goal_filtering``, ``weighted_is``,
``reward: sparse | binary | dense``; ``hindsight: false`` is plain TRPO.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from her_mpi import mpi
from her_mpi.algos.on_policy import OnPolicyAgent, OnPolicyParams, Relabelled, gae, global_sum, relabel
from her_mpi.algos.policies import detach_params
from her_mpi.settings import Unused, check, setting
from her_mpi.nets import FlatParameters
from her_mpi.optim import SyncedAdam
from her_mpi.rollout import Episodes

@dataclass
class HindsightParams(OnPolicyParams):
    """What HTRPO and HPG share: goal choice, relabelling, importance weights, critic."""

    goal_filtering: bool = setting(True, "Hindsight Goal Filtering (false: uniformly sampled achieved goals)")
    weighted_is: bool = setting(True, "weighted importance sampling: per (goal, step), normalise the importance "
                                      "ratios over episodes")
    is_normaliser: Literal["all", "running"] = setting(
        "all", "weighted IS: per (goal, step) divide by the ratios of all copies, an ended one at its last ratio "
               "(the paper's estimator over trajectories), or of the copies still running only (the authors' code)")
    max_log_ratio: float = setting(
        20.0, "each copy's cumulative log importance ratio log rho_t is clipped to +-this: 20 only keeps exp() "
              "finite (weights below e^-20 are nothing beside the rest either way); small values (1-5) truncate "
              "the weights, so the hindsight copies of a goal-specific policy keep some weight (biased)")
    original_goals: bool = setting(True, "also learn from the episodes under their own goals (the authors' "
                                         "configs: false)")
    reward: Literal["sparse", "binary", "dense"] = setting(
        "sparse", "reward of the rewritten episodes: sparse (T - t at the first success), binary (1 there: close to what "
                  "the authors' newest code pays, its reward scaling capping most T - t at one value) "
                  "or dense (-|achieved - goal|)")
    hold_goal: bool = setting(
        False, "rewritten episodes run past their first success, the sparse reward T - t paid at every step at the "
               "goal, so the policy also learns to stay there: for envs that go on after a success and judge the "
               "last step (continuous Fetch). false: each ends at its first success (the authors' hindsight copies)")
    n_goals: int = setting(100, "hindsight goals per iteration (0: every distinct achieved goal)")
    goal_decimals: int = setting(3, "achieved goals are rounded to this many decimals to find distinct ones")
    goal_filtering_scale: Literal["spread", "raw"] = setting(
        "spread", "Hindsight Goal Filtering's distances: in units of the original goals' spread per dimension, or "
                  "raw (the goals' own units, metres on Fetch: the authors' code)")
    adopt_first_statistics: bool = setting(
        False, "the first batch's input statistics are adopted without rewriting the networks, so the initial "
               "networks act on normalised inputs as their initialisation assumes (the authors' code); that "
               "iteration's probabilities are then those of the re-normalised policy. false: every normalizer "
               "update keeps the networks' functions, the first included")
    statistics: Literal["preserving", "lagged"] = setting(
        "preserving", "when the input normalizers take in a batch: before the step, the networks rewritten to "
                      "compute the same functions (preserving: the trust region sees every change of the policy), "
                      "or after the step and the critic's fit, the networks untouched (lagged, the authors' code: "
                      "the step is taken in the statistics the batch was collected with, and the next batch is "
                      "collected by the same weights on re-normalised inputs, a change no trust region measures)")
    statistics_rows: Literal["collected", "hindsight"] = setting(
        "collected", "what the input normalizers take in from a batch: the collected steps once each, with their own, "
                     "achieved and chosen goals (collected), or the rewritten copies' rows (hindsight, the authors' "
                     "code): each state once per copy still running there, each chosen goal once per row; the "
                     "original goals' rows left out")
    critic: bool = setting(True, "learn V(s, g) and take TD/GAE advantages, normalised (false: each row's advantage is "
                                 "the discounted return of the importance-weighted rewards, unnormalised: the "
                                 "authors' FetchReachDiscrete config, value_type None)")
    gae_lambda: float = setting(0.0, "GAE lambda (0: TD(0) advantages and targets, as in the authors' code)")
    bootstrap_time_limit: bool = setting(
        True, "a copy cut by the episode's time limit bootstraps from V at its last state (false: its last step is "
              "terminal, as the authors' code treats the time limit)")
    critic_iters: int = setting(20, "value-network gradient steps per iteration")
    critic_batch_size: int = setting(0, "rows per value-network step (0: the full batch)")
    entropy_coef: float = setting(0.0, "weight of an entropy bonus in the objective (0: none, as in the paper)")
    entropy_weighting: Literal["surrogate", "uniform"] = setting(
        "surrogate", "each row's entropy weighted as its surrogate term (h gamma^t / N_traj), or uniformly "
                     "(1 / N_traj: the authors' code, a plain mean over rows beside the surrogate's mean)")
    drop_instant_successes: bool = setting(
        False, "hindsight copies whose goal is reached by their first step get no rows and leave the importance "
               "normaliser (the authors' continuous-control code; their discrete code keeps them)")

    def validate(self, path: str) -> None:
        super().validate(path)
        check(self.entropy_coef >= 0, f"{path}.entropy_coef", self.entropy_coef, "a number >= 0")
        check(self.critic_iters >= 1, f"{path}.critic_iters", self.critic_iters, "an integer >= 1")
        check(self.max_log_ratio > 0, f"{path}.max_log_ratio", self.max_log_ratio, "a number > 0")
        for name in ("n_goals", "critic_batch_size"):
            check(getattr(self, name) >= 0, f"{path}.{name}", getattr(self, name), "an integer >= 0")
        check(0.0 <= self.gae_lambda <= 1.0, f"{path}.gae_lambda", self.gae_lambda, "a number in [0, 1]")
        check(self.original_goals or self.hindsight, f"{path}.original_goals", self.original_goals,
              "true when hindsight is off (no data otherwise)")

    SCHEDULE = ("it learns once per cycle: one policy step on all of the cycle's episodes, then algo.critic_iters "
                "value-network steps")
    BATCH = "its policy step uses every row of the cycle; the value network's steps use algo.critic_batch_size rows"

    def unused_keys(self, config) -> dict[str, Unused]:
        unused = super().unused_keys(config)
        if not self.hindsight:  # an ablation of a recipe tuned with hindsight: warned, not refused
            for name in ("goal_filtering", "goal_filtering_scale", "n_goals", "goal_decimals",
                         "drop_instant_successes", "max_log_ratio"):
                unused[f"algo.{name}"] = Unused("it chooses hindsight goals, and algo.hindsight is false", refuse=False)
        if not self.critic:  # an ablation of a recipe tuned with a critic: warned, not refused
            for name in ("gae_lambda", "critic_iters", "critic_batch_size", "lr_critic", "bootstrap_time_limit"):
                unused[f"algo.{name}"] = Unused("it trains the value network, and algo.critic is false", refuse=False)
        if self.hindsight and not self.goal_filtering:
            unused["algo.goal_filtering_scale"] = Unused("it measures Hindsight Goal Filtering's distances, and "
                                                         "algo.goal_filtering is false")
        if not self.weighted_is:
            unused["algo.is_normaliser"] = Unused("it normalises weighted IS, and algo.weighted_is is false")
        if not self.entropy_coef:
            unused["algo.entropy_weighting"] = Unused("it weights the entropy bonus, and algo.entropy_coef is 0")
        return unused


@dataclass
class HTRPOParams(HindsightParams):
    # Trust region in the paper's units (module docstring): 2e-5 for Fetch and Ms. Pac-Man,
    # 1e-3 for bit flipping at the paper's batch sizes.
    max_kl: float = setting(2e-5, "trust region size in the paper's units (2e-5 Fetch and Ms. Pac-Man, 1e-3 bit "
                                  "flipping)")
    cg_iters: int = setting(10, "conjugate-gradient iterations for the step direction")
    cg_damping: float = setting(1e-3, "damping added to the Hessian-vector products")
    hvp_subsample: float = setting(1.0, "fraction of rows used for Hessian-vector products (speed)")
    line_search_steps: int = setting(10, "backtracking line-search halvings before the step is rejected")
    line_search_accept_ratio: float = setting(
        0.0, "a line-search step is accepted when its improvement is > 0 and > this fraction of the improvement "
             "the gradient predicts for it (0.1: the authors' code; 0: any improvement; a prediction <= 0, possible "
             "only with kl: logratio, asks for any improvement)")
    kl: Literal["qkl", "analytic", "logratio"] = setting(
        "qkl", "divergence of the trust region: qkl (the paper's), analytic or logratio")

    def validate(self, path: str) -> None:
        super().validate(path)
        check(self.max_kl > 0, f"{path}.max_kl", self.max_kl, "a number > 0")
        for name in ("cg_iters", "line_search_steps"):
            check(getattr(self, name) >= 1, f"{path}.{name}", getattr(self, name), "an integer >= 1")
        check(self.cg_damping >= 0, f"{path}.cg_damping", self.cg_damping, "a number >= 0")
        check(0 < self.hvp_subsample <= 1, f"{path}.hvp_subsample", self.hvp_subsample, "a number in (0, 1]")
        check(0 <= self.line_search_accept_ratio < 1, f"{path}.line_search_accept_ratio",
              self.line_search_accept_ratio, "a number in [0, 1)")


@dataclass
class HPGParams(HindsightParams):
    RENAMED = {"pg_lr": "lr_actor"}

    lr_actor: float = setting(1e-3, "Adam learning rate of the policy on the weighted objective")

    def validate(self, path: str) -> None:
        super().validate(path)
        check(self.lr_actor > 0, f"{path}.lr_actor", self.lr_actor, "a number > 0")


def hindsight_goal_filtering(achieved: np.ndarray, original: np.ndarray, n_goals: int,
                             rng: np.random.Generator, scale_by_spread: bool = True) -> np.ndarray:
    """Algorithm 2 of the HTRPO paper. Candidates inside the bounding box of the original goals (over
    the dimensions where they vary) are spread out by farthest-point sampling from a random
    start; if none is inside, the achieved goals nearest to the original ones are taken.
    Distances are measured in units of the original goals' spread per dimension
    (``scale_by_spread``), else in the goals' own units."""
    n_goals = min(n_goals or len(achieved), len(achieved))
    low, high = original.min(axis=0), original.max(axis=0)
    varying = high > low
    spread = original.std(axis=0)
    scale = np.where(spread > 0, spread, 1.0) if scale_by_spread else np.ones_like(spread)
    inside = np.all((achieved[:, varying] >= low[varying]) & (achieved[:, varying] <= high[varying]), axis=1)
    if not inside.any():
        distance = np.linalg.norm((achieved[:, None, :] - original[None, :, :]) / scale, axis=-1).min(axis=1)
        return achieved[np.argsort(distance, kind="stable")[:n_goals]]
    valid = achieved[inside] / scale
    chosen = [int(rng.integers(len(valid)))]
    nearest = np.linalg.norm(valid - valid[chosen[0]], axis=1)
    while len(chosen) < min(n_goals, len(valid)):
        pick = int(np.argmax(nearest))
        if nearest[pick] <= 0:
            break  # only duplicates left
        chosen.append(pick)
        nearest = np.minimum(nearest, np.linalg.norm(valid - valid[pick], axis=1))
    return achieved[inside][chosen]


def without_instant_successes(data: Relabelled, first: int) -> Relabelled:
    """``data`` without the copies from index ``first`` on whose goal the first step reaches: their one
    action earns the full reward whatever it was (e.g. an untouched object's own start position)."""
    instant = data.success[:, 0].copy()
    instant[:first] = False
    keep = ~instant[:, None]
    return Relabelled(data.source, data.goals, data.mask & keep, data.terminal & keep,
                      np.where(instant, 0, data.length), data.success & keep)


def ending_at_time_limits(data: Relabelled) -> Relabelled:
    """``data`` with every copy's last step terminal, those cut by the time limit included."""
    last = np.arange(data.mask.shape[1])[None, :] == data.length[:, None] - 1
    return Relabelled(data.source, data.goals, data.mask, data.mask & last, data.length, data.success)


def effective_sample_size(weights: torch.Tensor) -> float:
    """Kish's ESS of the importance weights over all ranks' rows, (sum w)^2 / sum w^2: the paper's
    diagnostic of how many of the hindsight rows carry the estimate (11.6k of 320k on FetchPush)."""
    total, total_sq = global_sum(float(weights.sum()), float(weights.pow(2).sum()))
    return total ** 2 / total_sq if total_sq > 0 else 0.0


def conjugate_gradient(hvp, b: torch.Tensor, iterations: int, tolerance: float = 1e-10) -> torch.Tensor:
    """Solve H x = b for symmetric positive definite H given only x -> H x."""
    x = torch.zeros_like(b)
    r, p = b.clone(), b.clone()
    r_dot = r @ r
    for _ in range(iterations):
        if r_dot < tolerance:  # solved (b = 0 included, where alpha would be 0 / 0)
            break
        hp = hvp(p)
        alpha = r_dot / (p @ hp)
        x += alpha * p
        r -= alpha * hp
        new_r_dot = r @ r
        p = r + (new_r_dot / r_dot) * p
        r_dot = new_r_dot
    return x


class HindsightAgent(OnPolicyAgent):
    """Relabelling, importance weights, advantages and the critic; subclasses take the policy step."""

    # -- goals and data ------------------------------------------------------------------------

    def select_goals(self, episodes: Episodes) -> np.ndarray:
        """The same hindsight goals on every rank, from all ranks' achieved and original goals."""
        p = self.params
        steps = np.arange(1, episodes.ag.shape[1])[None, :] <= episodes.lengths[:, None]
        achieved = np.unique(np.round(episodes.ag[:, 1:][steps], p.goal_decimals), axis=0)
        original = np.unique(np.round(episodes.g[:, 0], p.goal_decimals), axis=0)
        achieved = np.unique(np.concatenate(mpi.allgather_object(achieved)), axis=0)
        original = np.unique(np.concatenate(mpi.allgather_object(original)), axis=0)
        rng = np.random.default_rng([self.config.train.seed, self.n_iterations])  # shared by all ranks
        if p.goal_filtering:
            return hindsight_goal_filtering(achieved, original, p.n_goals, rng,
                                            scale_by_spread=p.goal_filtering_scale == "spread").astype(np.float32)
        n = min(p.n_goals or len(achieved), len(achieved))
        return achieved[rng.choice(len(achieved), n, replace=False)].astype(np.float32)

    def rewards(self, episodes: Episodes, data: Relabelled) -> np.ndarray:
        copy, t = data.rows
        if self.params.reward == "dense":
            ag_next = episodes.ag[data.source[copy], t + 1]
            return -np.linalg.norm(ag_next - data.goals[copy, t + 1], axis=-1).astype(np.float32)
        paid = 1 if self.params.reward == "binary" else episodes.actions.shape[1] - t
        return np.where(data.success[copy, t], paid, 0).astype(np.float32)

    def relabelled(self, episodes: Episodes, goals: np.ndarray) -> Relabelled:
        """The original episodes (with algo.original_goals), then every episode under every goal."""
        p = self.params
        n, T = len(episodes), episodes.actions.shape[1]
        hindsight_source = np.tile(np.arange(n), len(goals))
        goal_rows = np.repeat(goals, n, axis=0)[:, None, :].repeat(T + 1, axis=1)
        n_original = self.n_original(episodes)
        source = np.concatenate([np.arange(n_original), hindsight_source])
        all_goals = np.concatenate([episodes.g[:n_original], goal_rows])
        data = relabel(episodes, source, all_goals, self.goal_fns.success, end_at_success=not p.hold_goal)
        if p.drop_instant_successes:
            data = without_instant_successes(data, first=n_original)
        if not p.bootstrap_time_limit:
            data = ending_at_time_limits(data)
        return data

    def n_original(self, episodes: Episodes) -> int:
        """How many of the rewritten copies are the episodes under their own goals (the first ones)."""
        return len(episodes) if self.params.original_goals else 0

    def take_in_statistics(self, episodes: Episodes, goals: np.ndarray, data: Relabelled) -> None:
        """The normalizers take in the batch (collective): algo.statistics_rows says which rows."""
        if self.params.statistics_rows == "collected":
            self.update_normalizers(episodes, goals)
            return
        copy, t = data.rows
        hindsight = copy >= self.n_original(episodes)
        copy, t = copy[hindsight], t[hindsight]
        state_counts = np.zeros(episodes.obs.shape[:2])  # [episode, step]: copies running there
        np.add.at(state_counts, (data.source[copy], t), 1.0)
        seen = state_counts > 0
        self.observe_inputs(episodes.obs[seen], data.goals[copy, t], obs_counts=state_counts[seen])

    def build_batch(self, episodes: Episodes, goals: np.ndarray,
                    data: Relabelled | None = None) -> tuple[dict[str, torch.Tensor], Relabelled]:
        """Rows of the original episodes and of every episode under every goal (``data``: the
        relabelled copies if already made), with the collecting policy's log-probabilities (call
        before the normalizers change)."""
        p = self.params
        n = len(episodes)
        n_original = self.n_original(episodes)
        if data is None:
            data = self.relabelled(episodes, goals)
        batch = self.row_tensors(episodes, data, next_inputs=False)  # learn() rebuilds the inputs
        batch["rewards"] = torch.from_numpy(self.rewards(episodes, data))
        copy, t = data.rows
        with torch.no_grad():
            log_prob_goal = self.policy_net.log_prob(batch["x"], batch["actions"])
            ep = data.source[copy]
            x_own = self.inputs_at(episodes, ep, t, episodes.g[ep, t])
            log_prob_own = self.policy_net.log_prob(x_own, batch["actions"])
            del x_own
        batch["old_log_prob"] = log_prob_goal
        weights = self.importance_weights(data, copy, t, (log_prob_goal - log_prob_own).numpy(),
                                          n_original=n_original, n_goals=len(goals))
        n_trajectories = global_sum(n)[0] * (len(goals) + (1 if p.original_goals else 0))
        batch["discounts"] = p.gamma ** torch.from_numpy(t).float() / n_trajectories
        batch["hindsight_weights"] = torch.from_numpy(weights)
        batch["coefficients"] = batch["hindsight_weights"] * batch["discounts"]  # the trust region's weights
        batch["surrogate_coefficients"] = batch["coefficients"]  # the objective's (return_advantages changes them)
        batch["uniform_coefficient"] = torch.tensor(1.0 / n_trajectories)
        return batch, data

    def importance_weights(self, data, copy, t, log_ratio, n_original, n_goals) -> np.ndarray:
        """h per row: the per-decision ratio rho_t (1 under the episodes' own goals), with weighted
        IS divided by the sum of rho_t over all ranks' episodes for the same goal and step.

        A copy that has ended (reached its goal, or its episode ended) sits in an absorbing state:
        it adds nothing to the numerator but keeps its last ratio in the normaliser, as the
        paper's estimator over trajectories reads (eq. 80). (Normalising over the still-running
        copies only would give the few long-running failures of a goal the weight of all its
        episodes at late steps; ``is_normaliser: running`` does that, as the authors' code does.)
        The episodes' own goals form one more goal group, of ratios 1."""
        M, T = data.mask.shape
        grid = np.zeros((M, T))
        grid[copy, t] = log_ratio
        grid[:n_original] = 0.0  # the original goals: on-policy data
        cap = self.params.max_log_ratio
        rho = np.exp(np.clip(np.cumsum(grid, axis=1), -cap, cap))  # frozen after the end
        rho[data.length == 0] = 0.0  # dropped copies (drop_instant_successes) are not in the estimator at all
        h = rho * data.mask
        if self.params.weighted_is:
            n_groups = n_goals + (1 if n_original else 0)
            group = np.concatenate([np.zeros(n_original, np.int64),
                                    np.repeat(np.arange(n_goals) + (1 if n_original else 0),
                                              (M - n_original) // max(n_goals, 1))])
            sums = np.zeros((n_groups, T))
            np.add.at(sums, group, rho if self.params.is_normaliser == "all" else h)
            sums = mpi.allreduce_sum_(sums)
            h = np.divide(h, sums[group], out=np.zeros_like(h), where=sums[group] > 0)  # 0: no copy there
        return h[copy, t].astype(np.float32)

    # -- the update ----------------------------------------------------------------------------

    def learn(self, episodes: Episodes) -> dict[str, float]:
        p = self.params
        goals = self.select_goals(episodes) if p.hindsight else np.zeros((0, self.spec.goal_dim), np.float32)
        data = self.relabelled(episodes, goals)
        adopt = p.adopt_first_statistics and self.n_iterations == 0
        if adopt:  # the networks now see normalised inputs; the batch is read as the new policy's
            self.take_in_statistics(episodes, goals, data)
        # The log-probs and weights of the policy that collected the batch (with ``adopt``: of the
        # re-normalised one). Then the normalizers take the batch in, with the networks rewritten to
        # compute the same functions, and the step is taken in the new statistics (the ones the next
        # batch is collected with). The importance ratio divides by the collecting policy; the trust
        # region is anchored at the policy the step starts from: the same policy, up to inputs
        # beyond the normalizer's clip range. (statistics=lagged: they take it in after the step, as
        # the authors' code does, and the networks are left as they are.)
        batch, data = self.build_batch(episodes, goals, data)
        if not adopt and p.statistics == "preserving":
            with self.functions_preserved():
                self.take_in_statistics(episodes, goals, data)
        batch.update(self.row_tensors(episodes, data, next_inputs=p.critic))
        with torch.no_grad():
            batch["anchor"] = detach_params(self.policy_net.params(batch["x"]))
            batch["anchor_log_prob"] = self.policy_net.log_prob_of(batch["anchor"], batch["actions"])
        n_rows = global_sum(len(batch["x"]))[0]
        if p.critic:
            targets = self.critic_advantages(batch, data, n_rows)
        else:
            self.return_advantages(batch, data)
        batch.pop("x_next", None)
        metrics = self.policy_step(batch)
        if p.critic:
            metrics["critic_loss"] = self.fit_value(batch["x"], targets, p.critic_iters, p.critic_batch_size)
        with torch.no_grad():
            entropy = float(self.policy_net.entropy(batch["x"][:1024]).mean())
        if not adopt and p.statistics == "lagged":  # the next batch's policy: these weights, the new statistics
            self.take_in_statistics(episodes, goals, data)
        # how many relabelled copies carry a reward (the sparse signal), and how many rows carry the estimate
        reached = global_sum(float(data.success.any(axis=1).sum()))[0]  # dropped copies have none
        metrics.update(n_goals=float(len(goals)), rows=float(n_rows), entropy=entropy, copies_reached=reached,
                       ess=effective_sample_size(batch["hindsight_weights"]))
        self.n_iterations += 1
        return metrics

    @torch.no_grad()
    def critic_advantages(self, batch, data: Relabelled, n_rows: float) -> torch.Tensor:
        """Normalised GAE (TD(0) by default) from the current critic into ``batch``; the critic's targets."""
        p = self.params
        value = self.value_net(batch["x"]).squeeze(-1)
        next_value = self.value_net(batch["x_next"]).squeeze(-1)
        advantages = torch.from_numpy(gae(data, batch["rewards"].numpy(), value.numpy(), next_value.numpy(),
                                          p.gamma, p.gae_lambda))
        total, total_sq = global_sum(float(advantages.sum()), float(advantages.pow(2).sum()))
        mean = total / n_rows
        std = max(np.sqrt(max(total_sq / n_rows - mean ** 2, 0.0)), 1e-8)
        batch["advantages"] = (advantages - mean) / std
        return advantages + value

    def return_advantages(self, batch, data: Relabelled) -> None:
        """The authors' critic-free estimator: row t's advantage is sum_k gamma^(k-t) h_k r_k over the
        rest of its copy (the importance weight sits on the reward's step, not on t), weighted by
        gamma^t / N_traj in the objective, unnormalised."""
        weighted_rewards = (batch["rewards"] * batch["hindsight_weights"]).numpy()
        zeros = np.zeros_like(weighted_rewards)
        batch["advantages"] = torch.from_numpy(gae(data, weighted_rewards, zeros, zeros, self.params.gamma, 1.0))
        batch["surrogate_coefficients"] = batch["discounts"]

    def surrogate(self, batch) -> torch.Tensor:
        """This rank's part of the weighted importance-sampled objective (sum over ranks = total)."""
        objective = self.importance_sampled_objective(batch)
        if self.params.entropy_coef:  # keeps the policy from collapsing onto one dash (FetchReachDiscrete)
            objective = objective + self.params.entropy_coef * self.entropy_term(batch, self.params.entropy_weighting)
        return objective

    def importance_sampled_objective(self, batch) -> torch.Tensor:
        """The objective without its entropy bonus (this rank's part)."""
        ratio = (self.policy_net.log_prob(batch["x"], batch["actions"]) - batch["old_log_prob"]).exp()
        return (batch["surrogate_coefficients"] * ratio * batch["advantages"]).sum()

    def entropy_term(self, batch, weighting: str) -> torch.Tensor:
        """The entropy bonus at coefficient 1: each row's entropy weighted uniformly or as its surrogate term."""
        weight = batch["uniform_coefficient"] if weighting == "uniform" else batch["surrogate_coefficients"]
        return (weight * self.policy_net.entropy(batch["x"])).sum()

    def divergence(self, batch, rows: torch.Tensor | None = None, kl: str = "qkl") -> torch.Tensor:
        """This rank's part of the trust-region quantity D (paper units, module docstring) between
        the step's anchor and the current policy, estimated from ``rows`` only, rescaled, when given."""
        if rows is not None:
            scale = len(batch["x"]) / max(len(rows), 1)
            batch = {k: batch[k][rows] for k in ("x", "actions", "anchor_log_prob", "coefficients")} | {
                "anchor": tuple(t[rows] for t in batch["anchor"])}
            return scale * self.divergence(batch, kl=kl)
        new = self.policy_net.params(batch["x"])
        if kl == "analytic":
            per_row = self.policy_net.kl(batch["anchor"], new)
        else:
            log_ratio = batch["anchor_log_prob"] - self.policy_net.log_prob_of(new, batch["actions"])
            per_row = 0.5 * log_ratio.pow(2) if kl == "qkl" else log_ratio
        return (1.0 - self.params.gamma) * (batch["coefficients"] * per_row).sum()

    @abstractmethod
    def policy_step(self, batch) -> dict[str, float]:
        """One policy update from the hindsight batch (HTRPO: trust-region step; HPG: gradient step)."""


class HTRPO(HindsightAgent):
    name = "htrpo"
    Params = HTRPOParams

    def __init__(self, spec, config, goal_fns, seed_sequence):
        super().__init__(spec, config, goal_fns, seed_sequence)
        self.policy_flat = FlatParameters(self.policy_net)

    def global_gradient(self, value: torch.Tensor, create_graph: bool = False) -> torch.Tensor:
        # zeros for parameters ``value`` does not use (a Gaussian's entropy uses only its log-std)
        grads = torch.autograd.grad(value, self.policy_flat.params, create_graph=create_graph, materialize_grads=True)
        return torch.cat([g.reshape(-1) for g in grads])

    def fisher_vector_product(self, batch, rows: torch.Tensor | None = None):
        """v -> (F + cg_damping) v, F the trust region's curvature over all ranks (from ``rows`` only, when given)."""
        p = self.params
        kl_gradient = self.global_gradient(self.divergence(batch, rows, p.kl), create_graph=True)

        def hvp(vector: torch.Tensor) -> torch.Tensor:
            product = torch.autograd.grad(kl_gradient @ vector, self.policy_flat.params, retain_graph=True)
            product = torch.cat([g.reshape(-1) for g in product])
            mpi.allreduce_sum_(product.numpy())
            return product + p.cg_damping * vector
        return hvp

    def policy_step(self, batch) -> dict[str, float]:
        p = self.params
        gradient = self.global_gradient(self.surrogate(batch))
        mpi.allreduce_sum_(gradient.numpy())
        rows = None
        if p.hvp_subsample < 1:
            n = len(batch["x"])
            rows = torch.randperm(n, generator=self.torch_rng)[: max(1, int(round(n * p.hvp_subsample)))]
        hvp = self.fisher_vector_product(batch, rows)
        direction = conjugate_gradient(hvp, gradient, p.cg_iters)
        curvature = float(direction @ hvp(direction))
        step = np.sqrt(2 * p.max_kl / max(curvature, 1e-30)) * direction
        expected = float(gradient @ step)
        start = self.policy_flat.param.clone()
        with torch.no_grad():
            before = global_sum(float(self.surrogate(batch)))[0]
            accepted, improvement, kl = 0, 0.0, 0.0
            for k in range(p.line_search_steps):
                self.policy_flat.param.copy_(start + 0.5 ** k * step)
                after, kl = global_sum(float(self.surrogate(batch)), float(self.divergence(batch, kl=p.kl)))
                improvement = after - before
                predicted = 0.5 ** k * expected
                if improvement > 0 and improvement > p.line_search_accept_ratio * predicted and kl <= 1.5 * p.max_kl:
                    accepted = k + 1
                    break
            else:
                self.policy_flat.param.copy_(start)
                improvement, kl = 0.0, 0.0
        return {"surrogate_improvement": improvement, "expected_improvement": expected, "kl": kl,
                "line_search_step": float(accepted)}


    def gradient_measures(self, batch, weighting: str = "uniform") -> dict[str, float]:
        """How the entropy bonus's gradient g_e compares with the objective's g_s on one hindsight batch,
        in the step's own (Fisher) metric and in the Euclidean one: |g_s|_F, |g_e|_F, their Fisher cosine
        (|g|_F = sqrt(g.F^-1 g), the size of the trust-region step g asks for). A diagnostic for
        choosing ``entropy_coef``: the bonus matters once entropy_coef * |g_e|_F nears |g_s|_F."""
        g_s = self.global_gradient(self.importance_sampled_objective(batch))
        g_e = self.global_gradient(self.entropy_term(batch, weighting))
        hvp, iterations = self.fisher_vector_product(batch), self.params.cg_iters
        d_s, d_e = conjugate_gradient(hvp, g_s, iterations), conjugate_gradient(hvp, g_e, iterations)
        norm_s, norm_e = float(g_s @ d_s) ** 0.5, float(g_e @ d_e) ** 0.5
        return {"fisher_norm_surrogate": norm_s, "fisher_norm_entropy": norm_e,
                "fisher_cosine": float(g_e @ d_s) / max(norm_s * norm_e, 1e-30) if norm_e else 0.0,
                "euclid_norm_surrogate": float(g_s.norm()), "euclid_norm_entropy": float(g_e.norm()),
                "entropy": float(self.policy_net.entropy(batch["x"][:1024]).mean().detach())}


class HPG(HindsightAgent):
    """Hindsight policy gradient: HTRPO's relabelling and importance weights, plain gradient step."""

    name = "hpg"
    Params = HPGParams

    def __init__(self, spec, config, goal_fns, seed_sequence):
        super().__init__(spec, config, goal_fns, seed_sequence)
        self.policy_optimizer = SyncedAdam(self.policy_net, self.params.lr_actor)
        self.policy_flat = self.policy_optimizer.flat

    def optimizers(self) -> dict:
        return {**super().optimizers(), "policy": self.policy_optimizer}

    def policy_step(self, batch) -> dict[str, float]:
        surrogate = self.surrogate(batch)
        self.policy_optimizer.minimize(-surrogate * mpi.size())  # averaged over ranks: the global sum
        with torch.no_grad():
            kl = global_sum(float(self.divergence(batch)))[0]  # QKL in HTRPO's units, for comparison
        return {"surrogate": float(global_sum(float(surrogate.detach()))[0]), "kl": kl}
