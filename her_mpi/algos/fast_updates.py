"""The off-policy updates through hand-derived passes: the default (``algo.fast_update: true``).

Each function here is the same update as its algorithm module writes in plain autograd
(``ActorCriticAgent.update`` with ``TD3.actor_step`` / ``SAC.actor_step``, ``DQN.update``), with
the derivatives of the losses with respect to the network outputs written out (a line each) and
the networks' backward passes run layer by layer by her_mpi/mlp.py: no autograd graph, each weight
gradient written straight into the optimizer's flat buffer, the critics' input gradient taken
without their weight gradients. At the recipes' shapes an update then costs about its matrix
multiplies (a third less than autograd; ``bench/update_floor.py``). tests/test_speed_paths.py
checks every algorithm and option against the autograd path to float tolerance.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from her_mpi.mlp import train_forward


def actor_critic_update(agent, batch):
    """DDPG, TD3 and SAC: the critics' regression onto the TD target, then the actor's step."""
    x, x_next = agent.input_pair(batch)
    with torch.no_grad():
        target = agent.td_target(batch, x_next)
    critic_pass = agent.critic.train_forward(torch.cat([x, batch["actions"]], -1))
    q = critic_pass.output.squeeze(-1)  # [n_critics, batch]
    td_error = target - q
    # critic_loss = sum over critics of mean_b w_b (target_b - q_b)^2, w the importance weights of
    # prioritized replay (else 1); its gradient w.r.t. q_b is -2 w_b (target_b - q_b) / batch
    grad_q = td_error * (-2.0 / td_error.shape[-1])
    squared = td_error * td_error
    if "weights" in batch:
        grad_q = grad_q * batch["weights"]
        squared = batch["weights"] * squared
    critic_loss = squared.mean(-1).sum()
    agent.critic_optimizer.backward_pass(critic_pass, grad_q)
    metrics = {"critic_loss": critic_loss, "q_mean": q.mean(), "target_mean": target.mean()}
    # The actor's gradient uses the same (not yet updated) critic, as in baselines.
    for optimizer in [agent.critic_optimizer] + agent.fast_actor_step(x, metrics):
        optimizer.step()
    return agent.with_kfac_scales(metrics), td_error[0].abs()


def td3_actor_step(agent, x, metrics) -> list:
    """TD3's (and DDPG's) actor: -Q_1(s, pi(s)) + action_l2 |pi(s)|^2."""
    actor_pass = agent.actor.train_forward(x)
    action = actor_pass.output
    # the first critic as a fixed function of the action: only its input gradient is needed
    critic_pass = agent.critic.member(0).train_forward(torch.cat([x, action], -1), frozen=True)
    q_pi = critic_pass.output
    l2 = agent.params.action_l2
    actor_loss = -q_pi.mean() + l2 * action.pow(2).mean()
    # d actor_loss / d action: -mean(q) through the critic's action inputs, plus the L2 term
    grad_action = critic_pass.input_gradient(torch.full_like(q_pi, -1.0 / q_pi.numel()),
                                             columns=slice(-action.shape[-1], None))
    grad_action.add_(action, alpha=2.0 * l2 / action.numel())
    agent.actor_optimizer.backward_pass(actor_pass, grad_action)
    agent.last_actor_loss = metrics["actor_loss"] = actor_loss
    return [agent.actor_optimizer]


def sac_actor_step(agent, x, metrics) -> list:
    """SAC's actor, alpha log pi - min_i Q_i, and its temperature."""
    actor_pass = agent.actor.train_forward(x, agent.torch_rng)
    action, log_prob = actor_pass.action, actor_pass.log_prob
    # the critics as a fixed function of the action: only their input gradient is needed
    critic_pass = agent.critic.train_forward(torch.cat([x, action], -1), frozen=True)
    q = critic_pass.output.squeeze(-1)
    q_pi, smaller = q.min(0)
    alpha = agent.temperature.alpha
    actor_loss = (alpha * log_prob - q_pi).mean()
    # d actor_loss / d q_pi = -1/batch, reaching the action through each sample's smaller critic;
    # d actor_loss / d log_prob = alpha/batch
    batch = len(q_pi)
    grad_q = torch.zeros_like(q).scatter_(0, smaller.unsqueeze(0), -1.0 / batch)
    grad_action = critic_pass.input_gradient(grad_q, columns=slice(-action.shape[-1], None))
    agent.actor_optimizer.backward_pass(actor_pass, (grad_action, alpha / batch))
    # alpha_loss = -mean(log_alpha * (log_prob + target_entropy)), linear in log(alpha)
    agent.temperature_optimizer.set_gradient(-(log_prob + agent.target_entropy).mean())
    metrics.update(actor_loss=actor_loss, alpha=alpha[0], entropy=-log_prob.mean())
    return [agent.actor_optimizer, agent.temperature_optimizer]


class SquashedGaussianPass:
    """SAC's actor's training forward: ``backward`` writes the gradient of
    sum(grad_action * action) + sum(grad_log_prob * log_prob) into the actor's ``.grad``."""

    def __init__(self, actor, body_pass, action, log_prob, scaled_noise, raw_log_std):
        self.actor, self.body_pass = actor, body_pass
        self.action, self.log_prob = action, log_prob
        self.scaled_noise, self.raw_log_std = scaled_noise, raw_log_std

    def backward(self, output_grad: tuple[torch.Tensor, torch.Tensor]) -> None:
        grad_action, grad_log_prob = output_grad
        grad_log_prob = grad_log_prob.reshape(-1, 1)
        a = self.action
        # action = tanh(u), u = mean + std * noise. Along the reparameterisation the Gaussian term of
        # log_prob is constant, so log_prob depends on u only through the tanh correction
        # (d/du = 2 tanh(u)) and on log_std through -log_std.
        grad_mean = grad_action * (1.0 - a * a) + 2.0 * grad_log_prob * a
        low, high = self.actor.log_std_bounds
        in_range = (self.raw_log_std >= low) & (self.raw_log_std <= high)  # the clamp's gradient
        grad_log_std = (grad_mean * self.scaled_noise - grad_log_prob) * in_range
        h = self.body_pass.output
        for head, grad in ((self.actor.mean, grad_mean), (self.actor.log_std, grad_log_std)):
            torch.mm(grad.t(), h, out=head.weight.grad)
            torch.sum(grad, 0, out=head.bias.grad)
        grad_h = torch.mm(grad_mean, self.actor.mean.weight.detach())
        grad_h.addmm_(grad_log_std, self.actor.log_std.weight.detach())
        self.body_pass.backward(grad_h)


def dqn_update(agent, batch):
    """(Double) DQN: the taken action's value regressed onto the TD target (Huber or squared error)."""
    x, x_next = agent.input_pair(batch)
    with torch.no_grad():
        target = agent.td_target(batch, x_next)
    q_pass = train_forward(agent.q_network, x)
    q_all = q_pass.output.detach()
    q = q_all.gather(-1, batch["actions"]).squeeze(-1)
    td_error = target - q
    # loss = mean_b w_b l(q_b - target_b), l Huber (delta 1) or squared, w the importance
    # weights of prioritized replay (else 1); l' is the error clipped to [-1, 1], or twice it
    if agent.params.loss == "huber":
        per_sample = F.huber_loss(q, target, reduction="none", delta=1.0)
        grad_q = (-td_error).clamp(-1.0, 1.0)
    else:
        per_sample = td_error.pow(2)
        grad_q = -2.0 * td_error
    if "weights" in batch:
        per_sample = batch["weights"] * per_sample
        grad_q = batch["weights"] * grad_q
    loss = per_sample.mean()
    # only the taken action's value enters the loss
    grad_q_all = torch.zeros_like(q_all).scatter_(-1, batch["actions"], (grad_q / len(q)).unsqueeze(-1))
    agent.optimizer.backward_pass(q_pass, grad_q_all)
    agent.optimizer.step()
    metrics = {"q_loss": loss, "q_mean": q.mean(), "target_mean": target.mean()}
    return metrics, td_error.abs()
