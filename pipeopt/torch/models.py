"""PyTorch models that ship with pipeopt: small enough to profile and run on a CPU in seconds.

Two architectures, the two families of the issue's experiment (issue 9):

* :class:`GPT` -- a GPT-2-style decoder: token and position embeddings, ``N`` pre-norm
  transformer blocks in ``self.layers`` (an :class:`torch.nn.ModuleList`), a final
  :class:`~torch.nn.LayerNorm` and an untied LM head. Its module FQNs are the ones
  torchtitan's Llama and torch.distributed.pipelining's examples use (``tok_emb``,
  ``pos_emb``, ``layers.0`` ... ``layers.{N-1}``, ``norm``, ``head``), so a split spec written
  for one reads the same on the other. The LM head is deliberately heavy (a vocabulary of
  4,096 against ``d_model`` 128 makes it cost about 1.3 blocks), as it is on real GPTs.
* :class:`CNN` -- a small ResNet-like network: a stem (conv, batch norm, ReLU), residual
  blocks in ``self.layers`` (an :class:`torch.nn.Sequential`) whose widths double where
  the resolution halves, then global average pooling and a linear head (``pool``, ``head``).

Every module is used once in ``forward`` (no shared ReLU), so the leaf-module graph of
:func:`pipeopt.torch.from_torch` is a DAG, and both models trace with ``torch.fx`` and
``torch.export`` (what ``torch.distributed.pipelining.pipeline`` uses).

Sizes: with the defaults, forward plus backward of one microbatch takes about 10-100 ms on
one CPU thread (AVX2 server core, ~40 GFLOP/s on these GEMMs); the ``*-tiny`` entries of
:data:`MODELS` take about 1 ms and are what the tests use.

Each factory returns ``(module, example_inputs)``: the module in training mode and a tuple of
one microbatch's inputs (seeded, so two calls give equal weights and inputs).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import os
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InvalidProblemError, MissingExtraError


# ---- GPT ---------------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention (one fused ``qkv`` projection, ``proj`` out).

    Parameters
    ----------
    d_model
        Width.
    heads
        Attention heads (``d_model`` must be a multiple).
    """

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: (batch, seq, d_model) -> (batch, seq, d_model)."""
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    """The transformer's feed-forward part: ``fc`` (d -> 4d), GELU, ``proj`` (4d -> d)."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, seq, d) -> (batch, seq, d)."""
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, seq, d) -> (batch, seq, d)."""
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A GPT-2-style decoder (Radford et al. 2019) without dropout and with an untied head.

    Parameters
    ----------
    vocab
        Vocabulary size (rows of ``tok_emb``, columns of ``head``).
    d_model
        Width.
    heads
        Attention heads.
    layers
        Transformer blocks (``self.layers``, a ModuleList).
    seq
        Largest sequence length (rows of ``pos_emb``).
    tie_weights
        Tie the LM head to the token embedding (``head.weight is tok_emb.weight``, as GPT-2
        does): one parameter used by two layers (default False: untied).

    ``forward(idx)`` maps token ids (batch, seq) int64 to logits (batch, seq, vocab).
    """

    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, seq: int,
                 tie_weights: bool = False) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(seq, d_model)
        self.layers = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        if tie_weights:
            self.head.weight = self.tok_emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, seq) -> logits (batch, seq, vocab)."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


# ---- CNN ---------------------------------------------------------------------------------------
class ResidualBlock(nn.Module):
    """A ResNet basic block (He et al., CVPR 2016): two 3x3 convolutions with batch norm,
    a projection shortcut (1x1 conv, stride) where the shape changes, ReLU after the sum.

    Parameters
    ----------
    c_in, c_out
        Channels in and out.
    stride
        Stride of the first convolution (2 halves the resolution).
    """

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
            if stride != 1 or c_in != c_out
            else nn.Identity()
        )
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, c_in, h, w) -> (batch, c_out, h / stride, w / stride)."""
        y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(y + self.shortcut(x))


class CNN(nn.Module):
    """A small ResNet-like image classifier.

    Parameters
    ----------
    width
        Channels of the stem and the first stage; each later stage doubles them.
    blocks
        ``tuple[int, ...]``: residual blocks per stage; every stage after the first starts with
        a stride-2 block. All blocks sit in ``self.layers`` (a Sequential), in order.
    classes
        Outputs of the head.
    in_channels
        Image channels.

    ``forward(x)`` maps images (batch, in_channels, h, w) to logits (batch, classes).
    """

    def __init__(self, width: int, blocks: tuple, classes: int, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        layers: list[nn.Module] = []
        c = width
        for stage, count in enumerate(blocks):
            c_out = width * 2**stage
            for i in range(count):
                layers.append(ResidualBlock(c, c_out, 2 if stage > 0 and i == 0 else 1))
                c = c_out
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images (batch, channels, h, w) -> logits (batch, classes)."""
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(self.pool(x), 1))


# ---- factories and the registry ----------------------------------------------------------------
def _positive(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidProblemError(f"{what} must be a positive integer, got {value!r}")
    return value


def gpt(
    *,
    vocab: int = 4096,
    d_model: int = 128,
    heads: int = 4,
    layers: int = 8,
    seq: int = 64,
    batch: int = 2,
    seed: int = 0,
    tie_weights: bool = False,
) -> tuple[nn.Module, tuple]:
    """A :class:`GPT` and one microbatch of token ids.

    Parameters
    ----------
    vocab, d_model, heads, layers, seq, tie_weights
        See :class:`GPT` (``seq`` is also the microbatch's sequence length).
    batch
        Sequences per microbatch.
    seed
        Seeds the weights and the token ids.

    Returns
    -------
    (module, example_inputs)
        ``example_inputs = (idx,)``, ``idx`` int64 of shape (batch, seq).

    Raises
    ------
    InvalidProblemError
        If a size is not a positive integer or ``d_model`` is not a multiple of ``heads``.
    """
    for value, what in ((vocab, "vocab"), (d_model, "d_model"), (heads, "heads"), (layers, "layers"),
                        (seq, "seq"), (batch, "batch")):
        _positive(value, what)
    if d_model % heads:
        raise InvalidProblemError(f"d_model {d_model} must be a multiple of heads {heads}")
    if not isinstance(tie_weights, bool):
        raise InvalidProblemError(f"tie_weights must be True or False, got {tie_weights!r}")
    gen = torch.manual_seed(seed)
    module = GPT(vocab, d_model, heads, layers, seq, tie_weights)
    idx = torch.randint(0, vocab, (batch, seq), generator=gen)
    return module.train(), (idx,)


def cnn(
    *,
    width: int = 32,
    blocks: tuple = (2, 2, 2),
    classes: int = 10,
    image: int = 32,
    batch: int = 4,
    seed: int = 0,
) -> tuple[nn.Module, tuple]:
    """A :class:`CNN` and one microbatch of images.

    Parameters
    ----------
    width, blocks, classes
        See :class:`CNN`.
    image
        Height and width of the square RGB images.
    batch
        Images per microbatch.
    seed
        Seeds the weights and the images.

    Returns
    -------
    (module, example_inputs)
        ``example_inputs = (x,)``, ``x`` float32 of shape (batch, 3, image, image).

    Raises
    ------
    InvalidProblemError
        If a size is not a positive integer, ``blocks`` is empty, or the image is smaller than
        the network's total stride.
    """
    for value, what in ((width, "width"), (classes, "classes"), (image, "image"), (batch, "batch")):
        _positive(value, what)
    blocks = tuple(blocks)
    if not blocks:
        raise InvalidProblemError("blocks must name at least one stage")
    for b in blocks:
        _positive(b, "blocks per stage")
    if image < 2 ** (len(blocks) - 1):
        raise InvalidProblemError(f"image {image} is smaller than the network's stride {2 ** (len(blocks) - 1)}")
    gen = torch.manual_seed(seed)
    module = CNN(width, blocks, classes)
    x = torch.randn(batch, 3, image, image, generator=gen)
    return module.train(), (x,)


MODELS: dict[str, Callable[..., tuple[nn.Module, tuple]]] = {
    "gpt": gpt,
    "cnn": cnn,
    "gpt-tiny": functools.partial(gpt, vocab=256, d_model=32, heads=2, layers=4, seq=16, batch=2),
    "cnn-tiny": functools.partial(cnn, width=8, blocks=(1, 1), image=8, batch=2),
}
"""Shipped models by name: factories returning ``(module, example_inputs)``; keyword
arguments override the sizes (``MODELS["gpt"](layers=4)``)."""


def build(name: str, **kwargs) -> tuple[nn.Module, tuple]:
    """The shipped model ``name`` (a key of :data:`MODELS`) with sizes overridden by ``kwargs``.

    Raises
    ------
    InvalidProblemError
        If the name is unknown (the message lists the known ones) or a size is invalid.
    """
    try:
        factory = MODELS[name]
    except KeyError:
        raise InvalidProblemError(f"unknown shipped model {name!r}; pipeopt ships {sorted(MODELS)}") from None
    try:
        return factory(**kwargs)
    except TypeError as exc:
        raise InvalidProblemError(f"model {name!r}: {exc}") from None



def load(spec: str, **kwargs) -> tuple[nn.Module, tuple]:
    """A model by name: a shipped one (a key of :data:`MODELS`), ``"hf:ClassName"`` (a Hugging
    Face transformers model from its config class, :func:`pipeopt.torch.hf.build`; ``kwargs``
    are config fields and the input sizes ``batch``, ``seq``, ``image``), ``"tv:name"`` (a
    torchvision model, :func:`torchvision_model`) or
    ``"package.module:factory"``, a function returning ``(module, example_inputs)``; ``kwargs``
    go to the factory. ``package`` is also looked for in the current folder (as
    ``python -m`` does), so a factory beside the user needs no ``PYTHONPATH``.

    Raises
    ------
    InvalidProblemError
        If the name is unknown, the module cannot be imported, the factory is missing or not
        callable, or it does not return ``(nn.Module, tuple of inputs)``.
    MissingExtraError
        ``hf:`` without transformers installed, ``tv:`` without torchvision.
    """
    if isinstance(spec, str) and spec.startswith("hf:"):
        from .hf import build as hf_build

        return hf_build(spec[3:], **kwargs)
    if isinstance(spec, str) and spec.startswith("tv:"):
        return torchvision_model(spec[3:], **kwargs)
    if not isinstance(spec, str) or ":" not in spec:
        return build(spec, **kwargs)
    path, _, attr = spec.partition(":")
    try:
        factory = getattr(_import_from_cwd(path), attr)
    except ImportError as exc:
        raise InvalidProblemError(f"cannot import {path!r} for model {spec!r}: {exc}") from None
    except AttributeError:
        raise InvalidProblemError(f"module {path!r} has no factory {attr!r} (model {spec!r})") from None
    if not callable(factory):
        raise InvalidProblemError(f"{spec!r} is not callable; give a factory returning (module, example_inputs)")
    try:
        made = factory(**kwargs)
    except TypeError as exc:
        raise InvalidProblemError(f"model {spec!r}: {exc}") from None
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module)):
        raise InvalidProblemError(
            f"{spec!r} must return (nn.Module, example_inputs), got {type(made).__name__}"
        )
    module, inputs = made
    return module, (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)


TORCHVISION_INSTALL = ("pip install torch==2.14.1 torchvision==0.29.1 (a matching pair: PyPI's torchvision does "
                       "not import beside a torch it was not built for)")


def torchvision_model(name: str, *, batch: int = 2, image: int = 224, **config) -> tuple[nn.Module, tuple]:
    """A torchvision model by its builder name (``"resnet50"``, ``"vit_b_16"``), with random
    weights (``weights=None``: nothing is downloaded), and one microbatch of ``batch`` RGB
    images of ``image`` x ``image`` pixels; ``config`` goes to
    :func:`torchvision.models.get_model` (e.g. ``num_classes``).

    Raises
    ------
    MissingExtraError
        If torchvision is not installed (or does not import beside this torch).
    InvalidProblemError
        If torchvision has no model ``name``, or ``batch`` / ``image`` is not a positive
        integer.
    """
    try:
        import torchvision
    except (ImportError, RuntimeError) as exc:
        raise MissingExtraError(f"tv: models need torchvision, which does not import here ({exc}): "
                                f"{TORCHVISION_INSTALL}") from None
    known = torchvision.models.list_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        raise InvalidProblemError(f"torchvision has no model {name!r}" + (f"; did you mean {close}?" if close else ""))
    for key, value in (("batch", batch), ("image", image)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidProblemError(f"tv:{name}: {key} must be a positive integer, got {value!r}")
    try:
        module = torchvision.models.get_model(name, weights=None, **config)
    except (TypeError, ValueError) as exc:
        raise InvalidProblemError(f"tv:{name}: {exc}") from None
    return module, (torch.randn(batch, 3, image, image),)


def _import_from_cwd(path: str):
    """``importlib.import_module(path)`` with the current folder first on ``sys.path`` for
    the lookup (restored afterwards)."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(path)
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)
