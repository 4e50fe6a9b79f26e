"""The multilayer perceptrons of the off-policy algorithms, with a hand-written training pass.

At the recipes' shapes (batch 256, 3x256 ReLU) an update should cost its matrix multiplies. Run
through autograd, every layer adds a handful of graph nodes, an engine walk, a zeroed and then
accumulated gradient per parameter, and Python around each of them: a third more time than the
multiplies. So the off-policy updates train their networks with explicit passes:

* ``network.train_forward(x)`` runs the layers and keeps each layer's output (a
  :class:`NetworkPass`); no autograd graph;
* ``network_pass.backward(d loss / d output)`` runs the chain rule layer by layer: one
  weight-gradient multiply written straight into the parameter's ``.grad`` (the optimizer's flat
  gradient buffer, so nothing is zeroed or accumulated), one bias sum, one input-gradient
  multiply (skipped below the first layer unless the input's gradient is asked for) and one
  activation derivative per layer.

The algorithms write their losses' derivatives with respect to the network outputs themselves
(a line each; tests/test_speed_paths.py checks every update against autograd). A
:class:`CriticEnsemble` runs its members as one stacked network: every layer is one batched
multiply over the members' weights, which the flat parameter buffer lays out back to back, so the
stack is a strided view, not a copy.

``forward`` stays ordinary autograd-differentiable PyTorch (on-policy algorithms take Hessian-
vector products through it, and ONNX export traces it); without gradients it runs the same layer
loop on cached weight views. Parameters stay the ``nn.Linear`` children of an ``nn.Sequential``,
so state dicts and checkpoints are unchanged.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# ReLU in place: no new 256x256 tensor per layer (Linear's backward needs its input, not output).
ACTIVATIONS = {"relu": lambda: nn.ReLU(inplace=True), "tanh": nn.Tanh, "elu": nn.ELU}
_NAMES = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.ELU: "elu"}

# Applied in place to a fresh layer output; the derivatives need only that output and write into
# ``out`` (the incoming gradient itself when the pass owns it: no new tensor per layer).
_FORWARD = {"relu": torch.relu_, "tanh": torch.tanh_, "elu": lambda z: F.elu_(z)}
_aten = torch.ops.aten


def direct_callable(overload):
    """An ATen overload's C++ callable, ``_op`` (the OpOverload's Python ``__call__`` costs as much
    as the op itself at these sizes). ``_op`` is private: where a PyTorch release drops it, the
    public overload is used instead, with the same arguments and results, only slower."""
    return getattr(overload, "_op", overload)


_threshold_backward = direct_callable(_aten.threshold_backward.grad_input)
_tanh_backward = direct_callable(_aten.tanh_backward.grad_input)
_elu_backward = direct_callable(_aten.elu_backward.grad_input)
_DERIVATIVE = {
    "relu": lambda g, y, out: _threshold_backward(g, y, 0, grad_input=out),
    "tanh": lambda g, y, out: _tanh_backward(g, y, grad_input=out),
    "elu": lambda g, y, out: _elu_backward(g, 1.0, 1, 1.0, True, y, grad_input=out),
}


def layer_forms(weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(W, W^T, b broadcastable over the batch) of one layer (W [out, in]) or a stack (W [n, out, in])."""
    if weight.dim() == 2:
        return weight, weight.t(), bias
    return weight, weight.transpose(1, 2), bias.unsqueeze(1)


def linear(h: torch.Tensor, layer: tuple) -> torch.Tensor:
    """h W^T + b for one network or a stack of n (h [n, B, in], or [B, in] shared by all)."""
    weight, weight_t, bias = layer
    if weight.dim() == 2:
        return torch.addmm(bias, h, weight_t)
    if h.dim() == 2:
        h = h.expand(weight.shape[0], *h.shape)
    return torch.baddbmm(bias, h, weight_t)


LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default


def forward_layers(x, layers, activations, norms=(), normalized: list | None = None) -> list[torch.Tensor]:
    """Every layer's output after its activation: [x, y_0, ..., y_last]. ``layers``: per layer
    :func:`layer_forms`; ``norms``: per layer whether a LayerNorm (no affine parameters) follows
    its linear map, before the activation. A training pass gives ``normalized``, a list that gets
    per layer the (input, mean, 1/std) the LayerNorm's derivative needs, or None."""
    outputs = [x]
    h = x
    for i, ((weight, weight_t, bias), activation) in enumerate(zip(layers, activations)):
        if weight.dim() == 2:
            h = torch.addmm(bias, h, weight_t)
        else:
            if h.dim() == 2:
                h = h.expand(weight.shape[0], *h.shape)
            h = torch.baddbmm(bias, h, weight_t)
        kept = None
        if norms and norms[i]:
            if normalized is None:  # F.layer_norm: differentiable twice and exported to ONNX as LayerNormalization
                h = F.layer_norm(h, h.shape[-1:], eps=LAYER_NORM_EPS)
            else:
                z = h  # a new tensor: the activation below works on the norm's output
                h, mean, rstd = torch.native_layer_norm(z, z.shape[-1:], None, None, LAYER_NORM_EPS)
                kept = (z, mean, rstd)
        if normalized is not None:
            normalized.append(kept)
        if activation:
            _FORWARD[activation](h)
        outputs.append(h)
    return outputs


_native_layer_norm_backward = direct_callable(_aten.native_layer_norm_backward.default)


def layer_norm_backward(grad: torch.Tensor, z: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """d loss / d z of n = (z - mean z) / std z (over the last axis) from d loss / d n."""
    return _native_layer_norm_backward(grad, z, z.shape[-1:], mean, rstd, None, None, [True, False, False])[0]


def backward_layers(grad, layers, activations, outputs, parameter_grads=None, input_grad: bool = False,
                    input_columns: slice | None = None, normalized: list | None = None):
    """The chain rule from ``grad`` = d loss / d output down through every layer.

    ``parameter_grads``: per layer the (dW, db) tensors to write the parameter gradients into, or
    None for none. ``input_columns``: only these columns of d loss / d input (e.g. the action part
    of a critic's input): the first layer's input-gradient multiply shrinks to them. Returns
    (d loss / d input if ``input_grad`` else None, [d loss / d z per layer]), z being a layer's
    output before its activation (and its LayerNorm: ``normalized`` from :func:`forward_layers`)."""
    n_layers = len(layers)
    output_grads = [None] * n_layers
    for i in range(n_layers - 1, -1, -1):
        activation = activations[i]
        if activation:  # in place, except on the caller's gradient (the top layer's)
            out = grad if i < n_layers - 1 else torch.empty_like(grad)
            grad = _DERIVATIVE[activation](grad, outputs[i + 1], out)
        if normalized and normalized[i] is not None:
            grad = layer_norm_backward(grad, *normalized[i])
        output_grads[i] = grad
        weight = layers[i][0]
        stacked = weight.dim() == 3
        if parameter_grads is not None:
            weight_grad, bias_grad = parameter_grads[i]
            layer_input = outputs[i]
            if not stacked:
                torch.mm(grad.t(), layer_input, out=weight_grad)
            else:
                if layer_input.dim() == 2:
                    layer_input = layer_input.expand(weight.shape[0], *layer_input.shape)
                torch.bmm(grad.transpose(1, 2), layer_input, out=weight_grad)
            torch.sum(grad, -2, out=bias_grad)
        if i > 0:
            grad = torch.bmm(grad, weight) if stacked else torch.mm(grad, weight)
        elif input_grad:
            if input_columns is not None:
                weight = weight[..., input_columns]
            grad = torch.bmm(grad, weight) if stacked else torch.mm(grad, weight)
    if not input_grad:
        return None, output_grads
    if grad.dim() == 3 and outputs[0].dim() == 2:
        grad = grad.sum(0)  # an input shared by stacked members collects all their gradients
    return grad, output_grads


class NetworkPass:
    """A training forward of an :class:`MLP` or :class:`CriticEnsemble`: the weights it used and
    every layer's output, which is all its backward needs."""

    __slots__ = ("network", "layers", "outputs", "frozen", "output", "normalized")

    def __init__(self, network, layers, x: torch.Tensor, frozen: bool):
        self.network, self.layers, self.frozen = network, layers, frozen
        self.normalized = [] if any(network.norms) else None
        self.outputs = forward_layers(x, layers, network.activations, network.norms, self.normalized)
        self.output = network.output_view(self.outputs[-1])  # [B, out]; ensembles [n, B, out]

    def backward(self, output_grad: torch.Tensor, parameters: bool = True, inputs: bool = False):
        """Write d loss / d parameters into the parameters' ``.grad`` (overwriting them) given
        ``output_grad`` = d loss / d output; return d loss / d input when ``inputs``."""
        if parameters and self.frozen:
            raise RuntimeError("a frozen pass (train_forward(..., frozen=True)) has no parameter gradients")
        destinations = self.network.gradient_buffers() if parameters else None
        input_grad, _ = backward_layers(output_grad.reshape(self.outputs[-1].shape), self.layers,
                                        self.network.activations, self.outputs, destinations, inputs,
                                        normalized=self.normalized)
        if destinations is not None:
            self.network.store_gradients(destinations)
        return input_grad

    def input_gradient(self, output_grad: torch.Tensor, columns: slice | None = None) -> torch.Tensor:
        """d loss / d input only: the network as a fixed function (e.g. the critic inside the
        actor's loss); ``columns``: only those input columns (e.g. the action's)."""
        return backward_layers(output_grad.reshape(self.outputs[-1].shape), self.layers,
                               self.network.activations, self.outputs, None, True, columns, self.normalized)[0]

    def output_gradients(self, output_grad: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """K-FAC: for every ``nn.Linear`` (in ``modules()`` order), its input in this pass and the
        gradient of <network output, ``output_grad``> w.r.t. its output, [B, .] each."""
        _, grads = backward_layers(output_grad.reshape(self.outputs[-1].shape), self.layers,
                                   self.network.activations, self.outputs, normalized=self.normalized)
        return self.network.per_linear(self.outputs[:-1], grads)


class AutogradPass:
    """The :class:`NetworkPass` interface for any other network (e.g. the CNN), through autograd."""

    def __init__(self, network: nn.Module, x: torch.Tensor):
        self.network, self.output = network, network(x)

    def backward(self, output_grad: torch.Tensor, parameters: bool = True, inputs: bool = False):
        if inputs or not parameters:
            raise ValueError("AutogradPass computes parameter gradients only (input gradients: the MLP passes)")
        params = [p for p in self.network.parameters() if p.requires_grad]
        for p in params:
            p.grad.zero_()  # ``backward`` overwrites, as the hand-written passes do
        torch.autograd.backward(self.output, output_grad.reshape(self.output.shape), inputs=params)


def train_forward(network: nn.Module, x: torch.Tensor, frozen: bool = False):
    """``network.train_forward(x)`` for the MLPs here, an :class:`AutogradPass` otherwise."""
    if hasattr(network, "train_forward"):
        return network.train_forward(x, frozen)
    return AutogradPass(network, x)


class MLP(nn.Sequential):
    """Linear layers with an activation between them and optionally after the last one.

    The children are those of the plain ``nn.Sequential`` this replaced (Linear, activation, ...),
    so state-dict keys are unchanged. Glorot-uniform weights and zero biases, like baselines.
    ``layer_norm``: a LayerNorm without parameters after every hidden Linear, before its
    activation (Linear, LayerNorm, activation, ...; mrl's networks, whose LayerNorms also scale
    and shift: here the next Linear does that), and after the last one too with ``norm_last``
    (a body whose output feeds other layers)."""

    def __init__(self, in_dim: int, hidden: list[int], out_dim: int, activation: str = "relu",
                 output_activation: type[nn.Module] | None = None, layer_norm: bool = False,
                 norm_last: bool = False):
        if output_activation is not None and output_activation not in _NAMES:
            raise ValueError(f"output activation {output_activation.__name__} is not one of "
                             f"{', '.join(c.__name__ for c in _NAMES)}")
        layers, last = [], in_dim
        for width in hidden:
            norm = [nn.LayerNorm(width, eps=LAYER_NORM_EPS, elementwise_affine=False)] if layer_norm else []
            layers += [nn.Linear(last, width), *norm, ACTIVATIONS[activation]()]
            last = width
        layers.append(nn.Linear(last, out_dim))
        if layer_norm and norm_last:
            layers.append(nn.LayerNorm(out_dim, eps=LAYER_NORM_EPS, elementwise_affine=False))
        for layer in layers:
            if isinstance(layer, nn.Linear):
                nn.init.xavier_uniform_(layer.weight)
                nn.init.zeros_(layer.bias)
        if output_activation is not None:
            layers.append(output_activation())
        super().__init__(*layers)
        self.linears = [layer for layer in layers if isinstance(layer, nn.Linear)]  # not re-registered
        self.first_weight = (self.linears[0].weight,)  # the caches' anchor (a plain reference)
        self.activations = tuple([activation] * len(hidden) + [_NAMES.get(output_activation)])
        self.norms = tuple([True] * len(hidden) + [norm_last]) if layer_norm else ()
        self._cache = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():  # autograd through the parameters themselves
            layers = [layer_forms(layer.weight, layer.bias) for layer in self.linears]
        else:
            layers = self.layer_weights()
        return forward_layers(x, layers, self.activations, self.norms)[-1]

    def train_forward(self, x: torch.Tensor, frozen: bool = False) -> NetworkPass:
        """A forward kept for :meth:`NetworkPass.backward`; ``frozen``: the parameters are
        constants of this pass (only input gradients will be asked for)."""
        return NetworkPass(self, self.layer_weights(), x, frozen)

    def layer_weights(self) -> list[tuple]:
        """Per layer :func:`layer_forms` of the detached parameters; cached while the parameters
        stay where they are (the optimizer's flat buffer and deep copies move them)."""
        return _cached(self, "weights", self.first_weight[0],
                       lambda l: layer_forms(l.weight.detach(), l.bias.detach()))

    def gradient_buffers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(W.grad, b.grad) per layer: views of the optimizer's flat gradient."""
        grad = self.first_weight[0].grad
        if grad is None:  # no optimizer (yet): gradients of their own
            for p in self.parameters():
                p.grad = torch.zeros_like(p)
            grad = self.first_weight[0].grad
        return _cached(self, "grads", grad, lambda l: (l.weight.grad, l.bias.grad))

    def store_gradients(self, destinations) -> None:
        """Nothing to do: :meth:`gradient_buffers` are the parameters' own ``.grad``."""

    @staticmethod
    def output_view(output: torch.Tensor) -> torch.Tensor:
        return output

    def per_linear(self, inputs, grads):
        return list(zip(inputs, grads))


def _cached(network, kind: str, anchor: torch.Tensor, per_layer) -> list:
    """``[per_layer(linear) ...]``, rebuilt when ``anchor`` (the first layer's weight or its
    gradient) has moved to another storage."""
    entry = network._cache.get(kind)
    if entry is None or entry[0] != anchor.data_ptr():
        entry = network._cache[kind] = (anchor.data_ptr(), [per_layer(layer) for layer in network.linears])
    return entry[1]


def mlp(in_dim: int, hidden: list[int], out_dim: int, activation: str = "relu",
        output_activation: type[nn.Module] | None = None, layer_norm: bool = False, norm_last: bool = False) -> MLP:
    return MLP(in_dim, hidden, out_dim, activation, output_activation, layer_norm, norm_last)


class CriticEnsemble(nn.Module):
    """n independent Q(s, g, a) networks evaluated together: [batch, in] -> [n, batch].

    A single critic (DDPG) runs as its one MLP; its outputs get the leading axis of size 1."""

    def __init__(self, in_dim: int, hidden: list[int], n: int, activation: str = "relu", layer_norm: bool = False):
        super().__init__()
        self.members = nn.ModuleList(mlp(in_dim, hidden, 1, activation, layer_norm=layer_norm) for _ in range(n))
        self.activations, self.norms = self.members[0].activations, self.members[0].norms
        self.n = n
        self._members = tuple(self.members)  # plain references (ModuleList indexing is slow Python)
        self._cache = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return torch.stack([member(x).squeeze(-1) for member in self.members])
        return self.output_view(forward_layers(x, self.layer_weights(), self.activations, self.norms)[-1]).squeeze(-1)

    def train_forward(self, x: torch.Tensor, frozen: bool = False) -> NetworkPass:
        """As :meth:`MLP.train_forward`; the pass's output is [n, B, 1]."""
        return NetworkPass(self, self.layer_weights(), x, frozen)

    def member(self, k: int) -> MLP:
        return self._members[k]

    def layer_weights(self) -> list[tuple]:
        """Per layer, :func:`layer_forms` of every member's (W, b) stacked: [n, out, in], [n, out]."""
        if self.n == 1:
            return self._members[0].layer_weights()
        entry = self._cache.get("weights")
        if entry is not None and entry[0] == self._members[0].first_weight[0].data_ptr():
            return entry[1]
        return self._stacked("weights", [[layer[0::2] for layer in member.layer_weights()]
                                         for member in self._members], forms=True)

    def gradient_buffers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self.n == 1:
            return self._members[0].gradient_buffers()
        entry = self._cache.get("grads")
        grad = self._members[0].first_weight[0].grad
        if entry is not None and grad is not None and entry[0] == grad.data_ptr():
            return entry[1]
        return self._stacked("grads", [member.gradient_buffers() for member in self._members])

    def _stacked(self, kind: str, per_member: list[list[tuple]], forms: bool = False) -> list[tuple]:
        """Stacked views are cached while the members stay where they are; copies (members not
        laid out evenly) are rebuilt every time, since they would not follow later updates."""
        first = per_member[0][0][0].data_ptr()
        stacked, views = stack_layers(per_member)
        if forms:
            stacked = [layer_forms(weight, bias) for weight, bias in stacked]
        self._cache[kind] = (first, stacked) if views else None
        return stacked

    def store_gradients(self, destinations) -> None:
        """Copy stacked gradients into the members' ``.grad`` unless they were views of them."""
        if self.n == 1 or self._cache.get("grads") is not None:  # cached: views
            return
        for k, member in enumerate(self.members):
            for (weight_grad, bias_grad), (dW, db) in zip(member.gradient_buffers(), destinations):
                if dW[k].data_ptr() != weight_grad.data_ptr():
                    weight_grad.copy_(dW[k])
                    bias_grad.copy_(db[k])

    def output_view(self, output: torch.Tensor) -> torch.Tensor:
        return output.unsqueeze(0) if self.n == 1 else output

    def per_linear(self, inputs, grads):
        if self.n == 1:
            return list(zip(inputs, grads))
        return [(layer_input if layer_input.dim() == 2 else layer_input[k], grad[k])
                for k in range(self.n) for layer_input, grad in zip(inputs, grads)]


def stack_layers(per_member: list[list[tuple]]) -> tuple[list[tuple], bool]:
    """Per layer, the members' tensors stacked on a new first axis: a strided view when they lie
    at equal steps in one storage (members back to back in the flat buffer), else a copy.
    Returns (stacked layers, whether all are views)."""
    stacked, all_views = [], True
    for layer in zip(*per_member):
        tensors = []
        for members_tensors in zip(*layer):
            view = evenly_spaced_view(list(members_tensors))
            all_views &= view is not None
            tensors.append(view if view is not None else torch.stack(members_tensors))
        stacked.append(tuple(tensors))
    return stacked, all_views


def evenly_spaced_view(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """[n, *shape] view of same-shaped contiguous tensors lying at equal steps in one storage."""
    first = tensors[0]
    if len(tensors) == 1:
        return first.unsqueeze(0)
    step = tensors[1].storage_offset() - first.storage_offset()
    storage = first.untyped_storage().data_ptr()
    for k, tensor in enumerate(tensors):
        if (tensor.shape != first.shape or not tensor.is_contiguous() or step <= 0
                or tensor.untyped_storage().data_ptr() != storage
                or tensor.storage_offset() != first.storage_offset() + k * step):
            return None
    return first.as_strided((len(tensors), *first.shape), (step, *first.stride()))
