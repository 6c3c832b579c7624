"""Training-state bytes of a layer: weights, gradients, optimizer state, buffers.

pipeopt's cost model charges a stage ``in_flight * act_bytes + versions * param_bytes``
(:func:`pipeopt.cost.rules.stage_memory`), so everything a layer keeps for the whole
iteration, whatever the number of microbatches in flight, is folded into its ``param_bytes``:

``param_bytes = state_bytes(weights) + buffer_bytes``

with, for ``w = sum(p.numel() * p.element_size())`` over the layer's parameters and ``n`` their
element count (:data:`OPTIMIZERS`):

``"adam-fp32"`` (default)
    weights + gradients + Adam's ``exp_avg`` and ``exp_avg_sq``, all in the parameters' own
    dtype (what :class:`torch.optim.Adam` allocates): ``4 w`` (16 bytes per fp32 parameter).
``"adam-mixed"``
    mixed-precision Adam (Micikevicius et al., ICLR 2018): fp16/bf16 weights and gradients,
    an fp32 master copy and two fp32 Adam states: ``2 + 2 + 4 + 4 + 4 = 16`` bytes per
    parameter, ``16 n`` (the ``16 Psi`` of ZeRO, Rajbhandari et al., SC 2020, section 3.1).
``"sgd"``
    weights + gradients (plain SGD, no momentum): ``2 w``.
``"weights"``
    the weights alone, ``w`` (what pipeopt's model zoo charges).

Buffers (batch-norm running statistics) count once: they have no gradient or optimizer
state. A parameter shared by several layers (tied weights) is in no layer's ``param_bytes``: it
is recorded once in the graph attribute ``tied`` with its ``state_bytes`` (this same rule), and
the cost model charges it on every stage that holds one of its layers (:mod:`pipeopt.cost.ties`).

The cost model uses ``param_bytes`` for two more things: the ring all-reduce of a replicated
stage (which moves the gradients, ``w``) and the weight versions of weight stashing (which
copy the weights, ``w``). With an optimizer other than ``"weights"`` both are therefore
overestimated (4x for Adam in fp32); the instance's assumptions say so.
"""

from __future__ import annotations

from ..errors import InvalidProblemError

OPTIMIZERS = {
    "adam-fp32": "Adam in fp32: weights + gradients + 2 Adam states in the parameters' dtype = 4 x weight bytes",
    "adam-mixed": "mixed-precision Adam: fp16 weights and gradients (2 + 2) + fp32 master, exp_avg, exp_avg_sq "
                  "(4 + 4 + 4) = 16 bytes per parameter (ZeRO, Rajbhandari et al. 2020)",
    "sgd": "SGD without momentum: weights + gradients = 2 x weight bytes",
    "weights": "weights only (no gradients or optimizer state, as the model zoo)",
}
"""Accepted ``optimizer`` values and what each charges."""


def check_optimizer(optimizer) -> str:
    """Return ``optimizer`` if it is a key of :data:`OPTIMIZERS`.

    Raises
    ------
    InvalidProblemError
        Naming the accepted values.
    """
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise InvalidProblemError(f"unknown optimizer {optimizer!r}; choose from {sorted(OPTIMIZERS)}")
    return optimizer


def state_bytes(weight_bytes: float, numel: int, optimizer: str) -> dict:
    """Weights, gradients and optimizer state of parameters of ``weight_bytes`` bytes and
    ``numel`` elements under ``optimizer`` (:data:`OPTIMIZERS`).

    Returns
    -------
    dict
        ``{"weights": ..., "grads": ..., "optimizer": ...}`` in bytes; their sum is what the
        layer's ``param_bytes`` holds besides its buffers.
    """
    check_optimizer(optimizer)
    w = float(weight_bytes)
    if optimizer == "adam-fp32":
        return {"weights": w, "grads": w, "optimizer": 2.0 * w}
    if optimizer == "adam-mixed":
        return {"weights": 2.0 * numel, "grads": 2.0 * numel, "optimizer": 12.0 * numel}
    if optimizer == "sgd":
        return {"weights": w, "grads": w, "optimizer": 0.0}
    return {"weights": w, "grads": 0.0, "optimizer": 0.0}
